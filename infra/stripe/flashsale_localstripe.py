"""The project's local Stripe: localstripe, corrected where it differs from Stripe's API.

localstripe (pinned in the Makefile, installed by `make tools` into .tools/venv) is a stateful
fake of Stripe's API with signed webhooks and a fake Stripe.js. Against a manual-capture
PaymentIntent flow it sends too few events, accepts what Stripe refuses, ignores
Idempotency-Key and cannot confirm a card from a page. This launcher imports it, applies the
patches below and serves. Each patch is one function; its docstring names the Stripe behaviour
it plays, in Stripe's words where the docs have them.

    .tools/venv/bin/python infra/stripe/flashsale_localstripe.py --port 8420 --from-scratch \
        [--in-memory] [--webhook-url URL --webhook-secret whsec_...]

The webhook (a URL and its signing secret, or FLASHSALE_STRIPE_WEBHOOK_URL and
FLASHSALE_STRIPE_WEBHOOK_SECRET) is registered through localstripe's POST /_config/webhooks/{id}
once the server listens: localstripe keeps webhooks in memory, so every start registers again.
"""

import argparse
import asyncio
import hashlib
import hmac
import importlib
import json
import logging
import os
import re
import socket
import sys
import time
from urllib.parse import parse_qsl

import aiohttp
from aiohttp import web
import localstripe
from localstripe import resources
from localstripe.errors import UserError
from localstripe.resources import Charge, Event, List, PaymentIntent, PaymentMethod, Refund
from localstripe import webhooks
from localstripe.webhooks import schedule_webhook

# The patches reach into localstripe's internals as this version has them.
LOCALSTRIPE_VERSION = '1.15.10'
OVERLAY_JS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'stripe-js-overlay.js')
WEBHOOK_ID = 'flashsale'


def refusal(message, status=400, type='invalid_request_error', **fields):
    """Stripe's error: {"error": {"type", "code", "message", ...}} (the fields given)."""
    error = UserError(status, message,
                      {k: v for k, v in fields.items() if v is not None})
    # UserError always says invalid_request_error; a card error or an idempotency error
    # says what it is.
    error.body['error']['type'] = type
    return error


def unexpected_state(intent, verb, allowed):
    return refusal(
        f'This PaymentIntent could not be {verb} because it has a status of '
        f'{intent.status}. Only a PaymentIntent with one of the following statuses may be '
        f'{verb}: {", ".join(allowed)}.',
        code='payment_intent_unexpected_state', payment_intent=intent._export())


## --- events ----------------------------------------------------------------------------

def announce_authorisation():
    """`payment_intent.amount_capturable_updated`: "Occurs when a PaymentIntent has funds to
    be captured. Check the amount_capturable property on the PaymentIntent to determine the
    amount that can be captured." Sent when a manual-capture PaymentIntent reaches
    requires_capture, and the PaymentIntent has `amount_capturable` (localstripe sends no
    event there, and has no such property)."""
    create_charge = PaymentIntent._create_charge

    def _create_charge(self, on_failure_now):
        create_charge(self, on_failure_now)
        if self.status == 'requires_capture':
            schedule_webhook(Event('payment_intent.amount_capturable_updated', self))

    PaymentIntent._create_charge = _create_charge
    PaymentIntent.amount_capturable = property(
        lambda self: self.amount if self.status == 'requires_capture' else 0)


def announce_failed_authentication():
    """`payment_intent.payment_failed`: "Occurs when a PaymentIntent has failed the attempt to
    create a payment method or a payment", a failed 3-D Secure authentication included (the
    PaymentIntent goes back to requires_payment_method). localstripe sends it for a declined
    charge only."""
    authenticate = PaymentIntent._api_authenticate

    def _api_authenticate(cls, id, **kwargs):
        intent = authenticate(id, **kwargs)
        if intent.status == 'requires_payment_method':
            schedule_webhook(Event('payment_intent.payment_failed', intent))
        return intent

    PaymentIntent._api_authenticate = classmethod(_api_authenticate)


## --- refusals ----------------------------------------------------------------------------

def capture_only_what_awaits_capture():
    """Capture: "Capture the funds of an existing uncaptured PaymentIntent when its status is
    requires_capture." Any other status is refused: 400 `payment_intent_unexpected_state`.
    (localstripe captures the charge of a cancelled PaymentIntent, and fails with a 500 on one
    never confirmed.)"""
    capture = PaymentIntent._api_capture

    def _api_capture(cls, id, **kwargs):
        intent = cls._api_retrieve(id)
        if intent.status != 'requires_capture':
            raise unexpected_state(intent, 'captured', ('requires_capture',))
        return capture(id, **kwargs)

    PaymentIntent._api_capture = classmethod(_api_capture)


CANCELLABLE = ('requires_payment_method', 'requires_capture', 'requires_confirmation',
               'requires_action', 'processing')
CANCELLATION_REASONS = ('duplicate', 'fraudulent', 'requested_by_customer', 'abandoned')


def cancel_with_a_reason_and_announce_it():
    """Cancel: "A PaymentIntent object can be canceled when it is in one of these statuses:
    requires_payment_method, requires_capture, requires_confirmation, requires_action or, in
    rare cases, processing", with an optional `cancellation_reason` (duplicate, fraudulent,
    requested_by_customer or abandoned); another status is refused with
    `payment_intent_unexpected_state`. `payment_intent.canceled`: "Occurs when a PaymentIntent
    is canceled." (localstripe refuses the reason, with a 400, and sends no event.)"""
    cancel = PaymentIntent._api_cancel

    def _api_cancel(cls, id, cancellation_reason=None, **kwargs):
        if cancellation_reason is not None and cancellation_reason not in CANCELLATION_REASONS:
            raise refusal('Invalid cancellation_reason: must be one of '
                          + ', '.join(CANCELLATION_REASONS), param='cancellation_reason')
        intent = cls._api_retrieve(id)
        if intent.status not in CANCELLABLE:
            raise unexpected_state(intent, 'canceled', CANCELLABLE)
        intent = cancel(id, **kwargs)
        intent.cancellation_reason = cancellation_reason
        intent.canceled_at = int(time.time())
        schedule_webhook(Event('payment_intent.canceled', intent))
        return intent

    PaymentIntent._api_cancel = classmethod(_api_cancel)


def refund_captured_money_once():
    """Refunds: "Creating a new refund will refund a charge that has previously been created
    but not yet refunded. [...] you can optionally refund only part of a charge. You can do so
    multiple times, until the entire charge has been refunded. Once entirely refunded, a charge
    can't be refunded again. This method will raise an error when called on an
    already-refunded charge, or when trying to refund more money than is left on a charge."
    Without `amount`, what is left is refunded.
    A PaymentIntent with nothing captured (authorised only, cancelled, never confirmed) is
    refused as Stripe words it: "This PaymentIntent (pi_...) does not have a successful charge
    to refund."; a charge refunded in full, with `charge_already_refunded`. `charge.refunded`:
    "Occurs whenever a charge is refunded, including partial refunds." Listing the refunds of a
    PaymentIntent without a charge answers an empty list. (localstripe refunds uncaptured and
    cancelled payments, refunds a charge twice and in full after a partial refund, sends no
    event, and answers that list with a 500.)"""
    def _api_create(cls, charge=None, payment_intent=None, amount=None, **data):
        if payment_intent is not None and charge is None:
            intent = PaymentIntent._api_retrieve(payment_intent)
            paid = intent.latest_charge
            if paid is None or intent.status != 'succeeded':
                raise refusal(f'This PaymentIntent ({intent.id}) does not have a successful '
                              'charge to refund.', param='payment_intent')
            charge = paid.id
        elif charge is not None and payment_intent is None:
            paid = Charge._api_retrieve(charge)
            if paid.payment_intent is not None and not paid.captured:
                raise refusal(f'This PaymentIntent ({paid.payment_intent}) does not have a '
                              'successful charge to refund.', param='charge')
        else:
            raise refusal('Exactly one of charge or payment_intent is required.')
        left = paid.amount - paid.amount_refunded
        if left <= 0:
            raise refusal(f'Charge {paid.id} has already been refunded.',
                          code='charge_already_refunded', charge=paid.id)
        asked = resources.try_convert_to_int(amount)
        if type(asked) is int and asked > left:
            raise refusal(f'Refund amount ({asked}) is greater than unrefunded amount on '
                          f'charge ({left})', param='amount')
        refund = cls(charge=charge, amount=left if amount is None else amount, **data)
        refund.payment_intent = paid.payment_intent
        # The event is made once this call is done, so that its charge shows the refund as it
        # begins (a refund test card sets its first status after this: refund_test_cards_move_on).
        asyncio.get_running_loop().call_soon(
            lambda: schedule_webhook(Event('charge.refunded', paid)))
        return refund

    list_all = Refund._api_list_all

    def _api_list_all(cls, url, charge=None, payment_intent=None, **kwargs):
        if charge is None and payment_intent is not None:
            if PaymentIntent._api_retrieve(payment_intent).latest_charge is None:
                return List(url, limit=kwargs.get('limit'))
        return list_all(url, charge=charge, payment_intent=payment_intent, **kwargs)

    Refund._api_create = classmethod(_api_create)
    Refund._api_list_all = classmethod(_api_list_all)


# The statuses of a refund that gave its money back, or never moved it.
GIVEN_BACK = ('failed', 'canceled')


def failed_refunds_refund_nothing():
    """A charge's `amount_refunded`: "Amount in cents refunded (can be less than the amount
    attribute on the charge if a partial refund was issued)"; `refunded`: "Whether the charge
    has been fully refunded." A refund whose status is failed or canceled refunded nothing: its
    amount is left on the charge, to be refunded again. A pending one counts, as the money is on
    its way. (localstripe counts every refund, whatever its status.)"""
    def amount_refunded(self):
        return sum(refund.amount for refund in self.refunds._list
                   if refund.status not in GIVEN_BACK)

    Charge.amount_refunded = property(amount_refunded)


# Stripe's presentment currencies, in its order, and the amounts it takes in each
# (docs.stripe.com/currencies): amounts are in the currency's smallest unit, cents for the
# two-decimal currencies, whole units for the zero-decimal ones, and for the three-decimal
# ones thousandths that end in 0; ISK is zero-decimal but given with two decimals, always 00.
PRESENTMENT_CURRENCIES = tuple("""
    usd aed afn all amd ang aoa ars aud awg azn bam bbd bdt bgn bhd bif bmd bnd bob brl bsd bwp
    byn bzd cad cdf chf clp cny cop crc cve czk djf dkk dop dzd egp etb eur fjd fkp gbp gel gip
    gmd gnf gtq gyd hkd hnl htg huf idr ils inr isk jmd jod jpy kes kgs khr kmf krw kwd kyd kzt
    lak lbp lkr lrd lsl mad mdl mga mkd mmk mnt mop mur mvr mwk mxn myr mzn nad ngn nio nok npr
    nzd omr pab pen pgk php pkr pln pyg qar ron rsd rub rwf sar sbd scr sek sgd shp sle sos srd
    std szl thb tjs tnd top try ttd twd tzs uah ugx uyu uzs vnd vuv wst xaf xcd xcg xof xpf yer
    zar zmw""".split())
ZERO_DECIMAL_CURRENCIES = frozenset(
    'bif clp djf gnf jpy kmf krw mga pyg rwf ugx vnd vuv xaf xof xpf'.split())
THREE_DECIMAL_CURRENCIES = frozenset('bhd jod kwd omr tnd'.split())
# "The amount value supports up to eight digits".
MAXIMUM_AMOUNT = 99999999
# Stripe's table of minimum charge amounts, in the smallest unit. Elsewhere the minimum is
# "$0.50 US or equivalent in charge currency", at a rate the fake does not have.
MINIMUM_AMOUNTS = {
    'usd': 50, 'aed': 200, 'aud': 50, 'bgn': 100, 'brl': 50, 'cad': 50, 'chf': 50,
    'czk': 1500, 'dkk': 250, 'eur': 50, 'gbp': 30, 'hkd': 400, 'huf': 17500, 'inr': 50,
    'jpy': 50, 'mxn': 1000, 'myr': 200, 'nok': 300, 'nzd': 50, 'pln': 200, 'ron': 200,
    'sek': 300, 'sgd': 50, 'thb': 1000,
}


def in_major_units(amount, currency):
    """`amount` (in the smallest unit of `currency`) as it reads: 50 eur is 0.50 eur."""
    decimals = (0 if currency in ZERO_DECIMAL_CURRENCIES
                else 3 if currency in THREE_DECIMAL_CURRENCIES else 2)
    if decimals == 0:
        return f'{amount} {currency}'
    whole, part = divmod(amount, 10 ** decimals)
    return f'{whole}.{part:0{decimals}d} {currency}'


def chargeable(amount, currency):
    """`amount` and `currency` as Stripe takes them (the currency in lower case, the amount a
    number), or the refusal Stripe answers them with. An amount that is not a positive whole
    number, and a missing currency, are left to localstripe's own checks."""
    if currency is None:
        return amount, currency
    if type(currency) is not str or currency.lower() not in PRESENTMENT_CURRENCIES:
        raise refusal(f'Invalid currency: {currency}. Stripe currently supports these '
                      f'currencies: {", ".join(PRESENTMENT_CURRENCIES)}', param='currency')
    currency = currency.lower()
    amount = resources.try_convert_to_int(amount)
    if type(amount) is not int or amount <= 0:
        return amount, currency
    if amount > MAXIMUM_AMOUNT:
        raise refusal('Amount must be no more than '
                      f'{in_major_units(MAXIMUM_AMOUNT, currency)}',
                      code='amount_too_large', param='amount')
    if currency in THREE_DECIMAL_CURRENCIES and amount % 10:
        raise refusal(f'Invalid amount: {amount}. An amount in {currency} must end in 0: '
                      'round it to the nearest ten.', param='amount')
    if currency == 'isk' and amount % 100:
        raise refusal(f'Invalid amount: {amount}. An amount in isk is in whole units given '
                      'with two decimals, always 00: divisible by 100.', param='amount')
    if amount < MINIMUM_AMOUNTS.get(currency, 0):
        raise refusal('Amount must be at least '
                      f'{in_major_units(MINIMUM_AMOUNTS[currency], currency)}',
                      code='amount_too_small', param='amount')
    return amount, currency


def charge_only_what_stripe_charges():
    """Supported currencies (docs.stripe.com/currencies): a PaymentIntent's `currency` is one
    of Stripe's presentment currencies, or it is refused with "Invalid currency: xyz. Stripe
    currently supports these currencies: ...". "All API requests expect amount values in the
    currency's minor unit"; for the three-decimal currencies (BHD, JOD, KWD, OMR, TND) "these
    API calls require the least-significant (last) digit to be 0"; ISK is zero-decimal but
    "to maintain backwards compatibility, you must pass in amounts with two decimals. For
    example, to charge 5 ISK, provide an amount value of 500" (an amount not divisible by 100
    is refused). "The amount value supports up to eight digits" (`amount_too_large` beyond),
    and a charge is at least the minimum of Stripe's table (`amount_too_small`, "Amount must
    be at least €0.50 eur"), where the table has one. The same holds when an update sets
    `amount` or `currency`. (localstripe takes any currency and any positive amount, and an
    update stores what it is sent as it is, a string included.)"""
    create = PaymentIntent._api_create
    update = PaymentIntent._api_update

    def _api_create(cls, amount=None, currency=None, **data):
        amount, currency = chargeable(amount, currency)
        return create(amount=amount, currency=currency, **data)

    def _api_update(cls, id, **data):
        if 'amount' in data or 'currency' in data:
            intent = cls._api_retrieve(id)
            amount = resources.try_convert_to_int(data.get('amount', intent.amount))
            if type(amount) is not int or amount <= 0:
                raise refusal(f'Invalid positive integer: {data["amount"]}', param='amount')
            amount, currency = chargeable(amount, data.get('currency', intent.currency))
            data.update({key: value for key, value in
                         (('amount', amount), ('currency', currency)) if key in data})
        return update(id, **data)

    PaymentIntent._api_create = classmethod(_api_create)
    PaymentIntent._api_update = classmethod(_api_update)


## --- cards -------------------------------------------------------------------------------

# Stripe's test cards for declined payments (docs.stripe.com/testing#declined-payments): the
# charge fails with `card_declined` and this `decline_code`.
DECLINED_CARDS = {
    '4000000000000002': 'generic_decline',
    '4000000000009995': 'insufficient_funds',
    '4000000000009987': 'lost_card',
    '4000000000009979': 'stolen_card',
}


def card_number(charge):
    """The number of the card `charge` was paid with; None for another payment method."""
    method = PaymentMethod._api_retrieve(charge.payment_method)
    return getattr(method, '_card_number', None)


def decline_code(charge):
    return DECLINED_CARDS.get(card_number(charge), 'generic_decline')


def decline_the_declined_cards():
    """Stripe's declined test cards ("Generic decline 4000000000000002", insufficient funds,
    lost card, stolen card) fail the payment: 402 with a `card_error`, code `card_declined`,
    its `decline_code` and the PaymentIntent, which goes back to requires_payment_method with
    that error as its `last_payment_error`. (localstripe declines them only when attached to a
    customer, charges them otherwise, and calls its declines invalid_request_error.)"""
    charging_is_declined = PaymentMethod._charging_is_declined

    def _charging_is_declined(self):
        return getattr(self, '_card_number', None) in DECLINED_CARDS or charging_is_declined(self)

    def _raise_failure(self):
        intent = (PaymentIntent._api_retrieve(self.payment_intent)._export()
                  if self.payment_intent else None)
        raise refusal(self.failure_message, status=402, type='card_error',
                      code=self.failure_code, decline_code=decline_code(self), charge=self.id,
                      payment_intent=intent)

    last_payment_error = PaymentIntent.last_payment_error.fget

    def last_card_error(self):
        error = last_payment_error(self)
        if error and error.get('code') == 'card_declined':
            error = dict(error, type='card_error', decline_code=decline_code(self.latest_charge))
        return error

    PaymentMethod._charging_is_declined = _charging_is_declined
    Charge._raise_failure = _raise_failure
    PaymentIntent.last_payment_error = property(last_card_error)


# Stripe's test cards for refunds (docs.stripe.com/testing#refunds): a refund of a charge paid
# with one begins in the first status and moves to the second some time later.
REFUND_CARDS = {
    '4000000000007726': ('pending', 'succeeded'),
    '4000000000005126': ('succeeded', 'failed'),
}
# "Some time later": how long, in seconds, such a refund stays in its first status.
REFUND_MOVES_ON_AFTER = 1


def refund_test_cards_move_on():
    """Stripe's refund test cards. 4000000000007726: "Charge succeeds. If you initiate a
    refund, its status begins as pending. Some time later, its status transitions to succeeded
    and sends a charge.refund.updated event." 4000000000005126: "Charge succeeds. If you
    initiate a refund, its status begins as succeeded. Some time later, its status transitions
    to failed and sends a charge.refund.updated event." A failed refund also sends
    `refund.failed` ("Occurs whenever a refund has failed"), has a `failure_reason` (unknown:
    the docs do not say which) and gives its amount back to the charge. Each event's object is
    the refund. A refund of any other card succeeds at once. (localstripe has every refund
    succeed at once.)"""
    create = Refund._api_create

    async def move_on(refund, status):
        await asyncio.sleep(REFUND_MOVES_ON_AFTER)
        refund.status = status
        if status == 'failed':
            refund.failure_reason = 'unknown'
        schedule_webhook(Event('charge.refund.updated', refund))
        if status == 'failed':
            schedule_webhook(Event('refund.failed', refund))

    def _api_create(cls, **data):
        refund = create(**data)
        statuses = REFUND_CARDS.get(card_number(Charge._api_retrieve(refund.charge)))
        if statuses is not None:
            refund.status, later = statuses
            asyncio.ensure_future(move_on(refund, later))
        return refund

    Refund._api_create = classmethod(_api_create)


CONFIRMABLE = ('requires_payment_method', 'requires_confirmation')


def confirm_with_a_payment_method():
    """Confirm: "Confirm that your customer intends to pay with current or provided payment
    method", given as `payment_method` (an id, such as the test method pm_card_visa) or as
    `payment_method_data` (a new card), from requires_payment_method or requires_confirmation;
    "If the selected payment method requires additional authentication steps, the
    PaymentIntent will transition to the requires_action status". After a declined attempt
    the PaymentIntent can be confirmed again with another card. `client_secret`, when given,
    must be the PaymentIntent's. (localstripe answers a `payment_method` with a 500, takes no
    card data, and cannot confirm again after a decline.)"""
    def _api_confirm(cls, id, payment_method=None, payment_method_data=None,
                     client_secret=None, use_stripe_sdk=None, return_url=None, **kwargs):
        if kwargs:
            raise refusal('Received unknown parameters: ' + ', '.join(kwargs))
        intent = cls._api_retrieve(id)
        if client_secret is not None and client_secret != intent.client_secret:
            raise refusal('The client_secret provided does not match the client_secret '
                          'associated with the PaymentIntent.', param='client_secret')
        if intent.status not in CONFIRMABLE:
            raise unexpected_state(intent, 'confirmed', CONFIRMABLE)
        if payment_method is not None and payment_method_data is not None:
            raise refusal('Provide either payment_method or payment_method_data, not both.')
        if payment_method_data is not None:
            if type(payment_method_data) is not dict:
                raise refusal('Invalid payment_method_data', param='payment_method_data')
            payment_method = PaymentMethod(**payment_method_data).id
        if payment_method is not None:
            intent.payment_method = PaymentMethod._api_retrieve(payment_method).id
        if intent.payment_method is None:
            raise refusal("You cannot confirm this PaymentIntent because it's missing a "
                          'payment method.', code='payment_intent_unexpected_state')
        if intent.latest_charge is not None and intent.latest_charge.status == 'failed':
            intent.latest_charge = None
        intent._confirm(on_failure_now=intent._report_failure)
        return intent

    PaymentIntent._api_confirm = classmethod(_api_confirm)


def patch_resources():
    each_endpoint_gets_its_events_on_its_own()
    announce_authorisation()
    announce_failed_authentication()
    capture_only_what_awaits_capture()
    cancel_with_a_reason_and_announce_it()
    refund_captured_money_once()
    failed_refunds_refund_nothing()
    charge_only_what_stripe_charges()
    decline_the_declined_cards()
    refund_test_cards_move_on()
    confirm_with_a_payment_method()
    # localstripe's extra routes hold the methods as they were at import; the server makes its
    # routes from this list when imported, which is after this.
    for i, (method, url, func) in enumerate(resources.extra_apis):
        owner = getattr(func, '__self__', None)
        if isinstance(owner, type):
            resources.extra_apis[i] = (method, url, getattr(owner, func.__name__))


## --- the server --------------------------------------------------------------------------

# What Stripe.js calls with the publishable key: confirm, and retrieve, the PaymentIntent its
# client secret names.
PAGE_CALLS = (
    ('POST', re.compile(r'^/v1/payment_intents/(pi_\w+)/confirm$')),
    ('GET', re.compile(r'^/v1/payment_intents/(pi_\w+)$')),
)


def publishable_key_with_client_secret(server):
    """A PaymentIntent's `client_secret`: "Used for client-side retrieval using a publishable
    key"; Stripe.js's confirmCardPayment and retrievePaymentIntent call the API with the
    publishable key and the client secret, for that PaymentIntent only (confirm, and
    retrieve). Anything else still needs the secret key. (localstripe answers both with
    401.)"""
    secret_key_only = server.auth_middleware

    @web.middleware
    async def auth_middleware(request, handler):
        intent_id = next((pattern.match(request.path).group(1)
                          for method, pattern in PAGE_CALLS
                          if request.method == method and pattern.match(request.path)), None)
        if intent_id is None or server.get_api_key(request) is not None:
            return await secret_key_only(request, handler)
        params = (await server.get_post_data(request, remove_auth=False) or {}
                  if request.method == 'POST' else server.unflatten_data(request.query))
        bearer = request.headers.get('Authorization', '').removeprefix('Bearer ')
        key = str(params.get('key') or bearer)
        intent = resources.store.get('payment_intent:' + intent_id)
        if (not key.startswith('pk_') or intent is None
                or params.get('client_secret') != intent.client_secret):
            raise UserError(401, 'Unauthorized')
        return await handler(request)

    middlewares = server.app.middlewares
    middlewares[middlewares.index(secret_key_only)] = auth_middleware


def json_errors(server):
    """Stripe answers every error as JSON; a failure of its own is a 500 `api_error`.
    (localstripe answers its crashes with aiohttp's plain-text 500.)"""
    @web.middleware
    async def api_errors(request, handler):
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except Exception:
            logging.getLogger('aiohttp.access').exception('localstripe failed')
            return server.json_response(
                {'error': {'type': 'api_error',
                           'message': 'localstripe failed on this request (see its log)'}},
                status=500)

    server.app.middlewares.insert(0, api_errors)


IDEMPOTENCY_WINDOW = 24 * 3600


def idempotent_requests(server):
    """Idempotent requests (docs.stripe.com/api/idempotent_requests): Stripe "saves the status
    code and body of the first request made with a given idempotency key after endpoint
    execution begins. Retries with the same key return the saved response, including 500
    errors", marked `Idempotent-Replayed: true`. "The idempotency layer compares incoming
    parameters to those of the original request and errors if they're not the same": 400
    `idempotency_error`, as for a key reused on another endpoint. Nothing is saved when the
    parameters fail validation or the request conflicts with one still executing (409
    `idempotency_key_in_use`). Keys go after 24 hours. Only POST takes a key. (localstripe
    ignores the header.)"""
    saved = {}
    in_flight = set()

    def answer(status, body, **headers):
        return web.Response(status=status, body=body, content_type='application/json',
                            headers=headers)

    def error(status, message, type='idempotency_error', **fields):
        body = {'error': {'type': type, 'message': message, **fields}}
        return answer(status, json.dumps(body, indent=2, sort_keys=True) + '\n')

    def began(status, body):
        if status < 400 or status >= 500 or status == 402:
            return True
        try:
            return bool(json.loads(body)['error'].get('code'))
        except (ValueError, KeyError, TypeError, AttributeError):
            return False

    @web.middleware
    async def idempotency(request, handler):
        key = request.headers.get('Idempotency-Key')
        if request.method != 'POST' or not key:
            return await handler(request)
        body = (await request.read()).decode('utf-8', 'replace')
        try:
            form = json.loads(body) if body.strip() else {}
        except ValueError:
            form = sorted(parse_qsl(body, keep_blank_values=True))
        parameters = json.dumps(
            [form, sorted(parse_qsl(request.query_string, keep_blank_values=True))],
            sort_keys=True)
        now = time.time()
        for old in [k for k, first in saved.items() if now - first['at'] > IDEMPOTENCY_WINDOW]:
            del saved[old]
        first = saved.get(key)
        if first is not None:
            if first['path'] != request.path:
                return error(400, 'Keys for idempotent requests can only be used for the same '
                             f"endpoint they were first used for ('{first['path']}' vs "
                             f"'{request.path}'). Try using a key other than '{key}' if you "
                             'meant to execute a different request.')
            if first['parameters'] != parameters:
                return error(400, 'Keys for idempotent requests can only be used with the same '
                             f"parameters they were first used with. Try using a key other "
                             f"than '{key}' if you meant to execute a different request.")
            return answer(first['status'], first['body'], **{'Idempotent-Replayed': 'true'})
        if key in in_flight:
            return error(409, 'There is currently another in-progress request using this '
                         f'Idempotent Key (that probably means you submitted twice, and the '
                         f'other request is still going through): {key}. Please try again '
                         'later.', type='invalid_request_error', code='idempotency_key_in_use')
        in_flight.add(key)
        try:
            response = await handler(request)
        finally:
            in_flight.discard(key)
        if isinstance(response, web.Response) and began(response.status, response.body):
            saved[key] = {'at': now, 'path': request.path, 'parameters': parameters,
                          'status': response.status, 'body': response.body}
        return response

    server.app.middlewares.insert(0, idempotency)


def stripe_js_confirms_the_card(server):
    """Stripe.js: `stripe.confirmCardPayment(clientSecret, {payment_method: {card: cardElement}})`
    confirms the PaymentIntent with the card typed into the Element, plays the card's 3-D
    Secure step when "the PaymentIntent will transition to the requires_action status", and
    resolves to {paymentIntent} or {error}; `stripe.retrievePaymentIntent(clientSecret)` reads
    it. The fake Stripe.js served at /js.stripe.com/v3/ gets both from stripe-js-overlay.js,
    appended to localstripe's script (whose confirmCardPayment ignores the card and fails on a
    fresh PaymentIntent)."""
    with open(OVERLAY_JS, encoding='utf-8') as f:
        overlay = f.read()

    @web.middleware
    async def stripe_js(request, handler):
        response = await handler(request)
        if request.path == '/js.stripe.com/v3/' and response.status == 200:
            response.text = response.text + '\n' + overlay
        return response

    server.app.middlewares.append(stripe_js)


# How long one delivery may take before it counts as failed. Stripe: "If Stripe doesn't
# quickly receive a 2xx response status code for an event, we mark the event as failed".
WEBHOOK_TIMEOUT = aiohttp.ClientTimeout(total=10)


def each_endpoint_gets_its_events_on_its_own():
    """Stripe delivers an event to each of the account's endpoints independently, and fails a
    delivery that is not answered quickly. localstripe posts to its endpoints one after another,
    each post waiting up to aiohttp's five minutes: one slow or vanished endpoint (a local stack
    of a test that ended) held up every other stack's events. Each endpoint now gets its own
    post, bounded by WEBHOOK_TIMEOUT."""
    async def deliver(webhook, event, payload, signed_payload):
        signature = hmac.new(webhook.secret.encode('utf-8'), signed_payload,
                             hashlib.sha256).hexdigest()
        headers = {'Content-Type': 'application/json; charset=utf-8',
                   'Stripe-Signature': 't=%d,v1=%s' % (event.created, signature)}
        logger = logging.getLogger('aiohttp.access')
        try:
            async with aiohttp.ClientSession(timeout=WEBHOOK_TIMEOUT) as session:
                async with session.post(webhook.url, data=payload, headers=headers) as r:
                    logger.info('webhook "%s" to %s answered %d', event.type, webhook.url,
                                r.status)
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            logger.info('webhook "%s" to %s failed: %r', event.type, webhook.url, e)

    async def send_webhook(event):
        payload = json.dumps(event._export(), indent=2, sort_keys=True).encode('utf-8')
        signed_payload = b'%d.%s' % (event.created, payload)
        await asyncio.sleep(1)
        endpoints = [webhook for webhook in list(webhooks._webhooks.values())
                     if webhook.events is None or event.type in webhook.events]
        await asyncio.gather(*(deliver(webhook, event, payload, signed_payload)
                               for webhook in endpoints))

    # schedule_webhook, imported by name everywhere, looks this up when it runs.
    webhooks._send_webhook = send_webhook


def webhooks_can_be_removed(server):
    """Stripe's `DELETE /v1/webhook_endpoints/{id}` removes an endpoint. localstripe registers
    webhooks with its own `POST /_config/webhooks/{id}` and has no way to remove one: a local
    stack that stops removes its own with `DELETE` on the same path, so that a local Stripe
    shared by many stacks posts only to endpoints that are there."""
    async def remove_webhook(request):
        id = request.match_info['id']
        removed = webhooks._webhooks.pop(id, None) is not None
        return web.json_response({'id': id, 'deleted': removed})

    server.app.router.add_delete('/_config/webhooks/{id}', remove_webhook)



# The restricted keys registered with `POST /_config/restricted_keys/{key}`, each with its
# permissions.
RESTRICTED_KEYS = {}


def required_permission(method, path):
    """The permission a call needs, named as Stripe names it in its refusal: `rak_` and the
    resource, `_read` for a GET, `_write` for anything else (Write grants Read)."""
    resource = path.removeprefix('/v1/').split('/', 1)[0]
    singular = {'payment_intents': 'payment_intent', 'refunds': 'refund',
                'payment_methods': 'payment_method', 'charges': 'charge',
                'events': 'event'}.get(resource, resource.rstrip('s'))
    return f'rak_{singular}_{"read" if method == "GET" else "write"}'


def restricted_keys_have_only_their_permissions(server):
    """Restricted API keys (docs.stripe.com/keys/restricted-api-keys): a key `rk_test_...` or
    `rk_live_...` "can only perform the actions you authorize", each resource Read, Write or
    None; "if a restricted API key doesn't have the correct permissions to complete an API
    request, Stripe returns a permission error": 403, `invalid_request_error`, "The provided
    key 'rk_test_***...' does not have the required permissions for this endpoint on account
    'acct_...'. Having the 'rak_refund_write' permission would allow this request to
    continue." (localstripe refuses every `rk_` key with 401.) The dashboard makes the key;
    here `POST /_config/restricted_keys/{key}` with `permissions[]` registers it, Write
    implying Read."""
    secret_key = server.get_api_key

    def bearer(request):
        header = request.headers.get('Authorization', '')
        return header.removeprefix('Bearer ') if header.startswith('Bearer ') else None

    def get_api_key(request):
        key = bearer(request)
        return key if key in RESTRICTED_KEYS else secret_key(request)

    @web.middleware
    async def permissions(request, handler):
        key = bearer(request)
        if key is None or not key.startswith('rk_') or not request.path.startswith('/v1/'):
            return await handler(request)
        granted = RESTRICTED_KEYS.get(key)
        if granted is None:
            return server.json_response(
                {'error': {'type': 'invalid_request_error',
                           'message': f'Invalid API Key provided: {key[:8]}****{key[-4:]}'}},
                status=401)
        needed = required_permission(request.method, request.path)
        if needed in granted or needed.replace('_read', '_write') in granted:
            return await handler(request)
        return server.json_response(
            {'error': {'type': 'invalid_request_error',
                       'message': f"The provided key '{key[:8]}***{key[-4:]}' does not have "
                                  "the required permissions for this endpoint on account "
                                  f"'acct_localstripe'. Having the '{needed}' permission "
                                  "would allow this request to continue."}},
            status=403)

    async def register(request):
        key = request.match_info['key']
        if not key.startswith(('rk_test_', 'rk_live_')):
            return web.json_response({'error': {'type': 'invalid_request_error',
                                                'message': 'a restricted key is rk_test_...'}},
                                     status=400)
        form = await request.post()
        RESTRICTED_KEYS[key] = frozenset(form.getall('permissions[]', []))
        return web.json_response({'key': key, 'permissions': sorted(RESTRICTED_KEYS[key])})

    server.get_api_key = get_api_key
    server.app.router.add_post('/_config/restricted_keys/{key}', register)
    server.app.middlewares.insert(0, permissions)


def patch_server(server):
    webhooks_can_be_removed(server)
    publishable_key_with_client_secret(server)
    json_errors(server)
    idempotent_requests(server)
    stripe_js_confirms_the_card(server)
    restricted_keys_have_only_their_permissions(server)


def patched_server():
    """localstripe's server module with every patch applied: resources first, as the server
    makes its routes from them when imported."""
    if localstripe.__version__ != LOCALSTRIPE_VERSION:
        sys.exit(f'flashsale_localstripe: patches written for localstripe {LOCALSTRIPE_VERSION}, '
                 f'found {localstripe.__version__}')
    if 'localstripe.server' in sys.modules:
        sys.exit('flashsale_localstripe: localstripe.server was imported before the patches')
    patch_resources()
    server = importlib.import_module('localstripe.server')
    patch_server(server)
    return server


async def serve(server, args):
    logger = logging.getLogger('aiohttp.access')
    logger.setLevel(logging.DEBUG)
    logger.addHandler(logging.StreamHandler())
    # As localstripe listens: IPv4 and IPv6, every interface.
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(('::', args.port))
    runner = web.AppRunner(server.app, access_log=logger)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    port = sock.getsockname()[1]
    if args.webhook_url:
        await register_webhook(port, args.webhook_url, args.webhook_secret, args.webhook_events)
    print(f'flashsale_localstripe: localstripe {localstripe.__version__}, patched, on port '
          f'{port}', flush=True)
    await asyncio.Event().wait()


async def register_webhook(port, url, secret, events):
    data = [('url', url), ('secret', secret)] + [('events[]', e) for e in events]
    async with aiohttp.ClientSession() as session:
        async with session.post(f'http://127.0.0.1:{port}/_config/webhooks/{WEBHOOK_ID}',
                                data=data) as response:
            if response.status != 200:
                sys.exit(f'flashsale_localstripe: registering the webhook {url} answered '
                         f'{response.status}: {await response.text()}')
    print(f'flashsale_localstripe: webhook {url} registered'
          + (f' for {", ".join(events)}' if events else ''), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--port', type=int, default=8420)
    parser.add_argument('--from-scratch', action='store_true',
                        help="do not reload the objects of localstripe's last run")
    parser.add_argument('--in-memory', action='store_true',
                        help='keep the objects in memory only: localstripe otherwise pickles '
                        'its whole store to /tmp/localstripe.pickle after every write, which '
                        'slows each call as a run adds objects')
    parser.add_argument('--webhook-url', default=os.environ.get('FLASHSALE_STRIPE_WEBHOOK_URL'))
    parser.add_argument('--webhook-secret',
                        default=os.environ.get('FLASHSALE_STRIPE_WEBHOOK_SECRET'))
    parser.add_argument('--webhook-events', default='',
                        help='comma-separated event types to send (default: every event)')
    args = parser.parse_args(argv)
    args.webhook_events = [e for e in args.webhook_events.split(',') if e]
    if bool(args.webhook_url) != bool(args.webhook_secret):
        parser.error('--webhook-url and --webhook-secret go together')
    server = patched_server()
    if not args.from_scratch:
        resources.store.try_load_from_disk()
    if args.in_memory:
        resources.store.dump_to_disk = lambda: None
    asyncio.run(serve(server, args))


if __name__ == '__main__':
    main()
