/*
 * flashsale: appended to localstripe's fake Stripe.js by infra/stripe/flashsale_localstripe.py.
 *
 * Stripe.js's stripe.confirmCardPayment(clientSecret, {payment_method: {card: element}}),
 * played with the card typed into localstripe's card Element: it confirms the PaymentIntent
 * with the publishable key and the client secret (POST /v1/payment_intents/{id}/confirm with
 * payment_method_data), plays the 3-D Secure step when the PaymentIntent requires_action
 * (localstripe's dialog, then its _authenticate call), and resolves to {paymentIntent} or
 * {error} as Stripe.js does. stripe.retrievePaymentIntent(clientSecret) reads it. The
 * Element's fields get labels, so that the page stays accessible.
 *
 * Uses localstripe's LOCALSTRIPE_BASE_API, openModal and Stripe, defined above this.
 */
(function () {
  const localStripe = Stripe;
  const FIELDS = {
    number: ['Card number', 'cc-number'],
    exp_month: ['Expiry month (MM)', 'cc-exp-month'],
    exp_year: ['Expiry year (YY)', 'cc-exp-year'],
    cvc: ['Security code (CVC)', 'cc-csc'],
    postal_code: ['Postal code', 'postal-code'],
  };

  // {a: {b: 1}} as a[b]=1, as Stripe.js encodes its requests.
  function encode(params, value, prefix) {
    if (value !== null && typeof value === 'object') {
      Object.keys(value).forEach((k) => encode(params, value[k], prefix ? `${prefix}[${k}]` : k));
    } else if (value !== undefined && value !== null) {
      params.append(prefix, String(value));
    }
    return params;
  }

  async function call(method, path, params) {
    const encoded = encode(new URLSearchParams(), params);
    const url = `${LOCALSTRIPE_BASE_API}${path}`;
    const response = method === 'GET'
      ? await fetch(`${url}?${encoded}`)
      : await fetch(url, {
        method,
        headers: {'Content-Type': 'application/x-www-form-urlencoded'},
        body: encoded,
      });
    const body = await response.json().catch(() => ({}));
    return response.ok && !body.error ? {intent: body} : {error: body.error || {
      type: 'api_error', message: `localstripe answered ${response.status}`}};
  }

  function intentId(clientSecret) {
    const found = /^(pi_[A-Za-z0-9]+)_secret_/.exec(clientSecret || '');
    return found && found[1];
  }

  // The card an Element holds, or the error Stripe.js gives for an incomplete one.
  function cardOf(element) {
    const value = element && element.value;
    const number = value ? String(value.card.number).replace(/\D/g, '') : '';
    if (number.length < 16) {
      return {error: {type: 'validation_error', code: 'incomplete_number',
                      message: 'Your card number is incomplete.'}};
    }
    return {
      card: {number, exp_month: value.card.exp_month, exp_year: value.card.exp_year,
             cvc: value.card.cvc},
      postalCode: value.postal_code,
    };
  }

  // A PaymentIntent back at requires_payment_method failed: its last_payment_error is the error.
  function outcome(intent) {
    if (intent.status === 'requires_payment_method' && intent.last_payment_error) {
      return {error: {...intent.last_payment_error, payment_intent: intent}};
    }
    return {paymentIntent: intent};
  }

  function labelled(elements) {
    const create = elements.create;
    elements.create = function (type, options) {
      const element = create.call(this, type, options);
      const mount = element.mount;
      element.mount = function (domElement) {
        mount.call(this, domElement);
        Object.keys(FIELDS).forEach((field) => {
          const input = this._inputs && this._inputs[field];
          if (input) {
            input.setAttribute('aria-label', FIELDS[field][0]);
            input.setAttribute('autocomplete', FIELDS[field][1]);
            input.setAttribute('inputmode', 'numeric');
          }
        });
      };
      return element;
    };
    return elements;
  }

  Stripe = function (apiKey) {
    const stripe = localStripe(apiKey);
    const elements = stripe.elements;
    stripe.elements = (...args) => labelled(elements(...args));

    stripe.retrievePaymentIntent = async (clientSecret) => {
      console.log('localstripe: Stripe().retrievePaymentIntent()');
      const found = await call('GET', `/v1/payment_intents/${intentId(clientSecret)}`,
                               {key: apiKey, client_secret: clientSecret});
      return found.error ? {error: found.error} : {paymentIntent: found.intent};
    };

    stripe.confirmCardPayment = async (clientSecret, data) => {
      console.log('localstripe: Stripe().confirmCardPayment()');
      const pi = intentId(clientSecret);
      if (!pi) {
        return {error: {type: 'invalid_request_error',
                        message: 'Invalid value for confirmCardPayment: clientSecret'}};
      }
      const auth = {key: apiKey, client_secret: clientSecret};
      const method = (data || {}).payment_method;
      const params = {...auth};
      if (typeof method === 'string') {
        params.payment_method = method;
      } else if (method && method.card) {
        const entered = cardOf(method.card);
        if (entered.error) {
          return {error: entered.error};
        }
        const billing = {...(method.billing_details || {})};
        if (entered.postalCode) {
          billing.address = {postal_code: entered.postalCode, ...(billing.address || {})};
        }
        params.payment_method_data = {type: 'card', card: entered.card};
        if (Object.keys(billing).length) {
          params.payment_method_data.billing_details = billing;
        }
      }
      let answer = await call('POST', `/v1/payment_intents/${pi}/confirm`, params);
      if (!answer.error && answer.intent.status === 'requires_action') {
        const success = await openModal('3D Secure\nDo you want to confirm or cancel?',
                                        'Complete authentication', 'Fail authentication');
        answer = await call('POST', `/v1/payment_intents/${pi}/_authenticate?success=${success}`,
                            auth);
      }
      return answer.error ? {error: answer.error} : outcome(answer.intent);
    };
    return stripe;
  };
})();
