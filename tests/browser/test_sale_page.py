"""The sale page and the admin console in a real browser (headless Chromium), against the
real local stack. Every wait is a deadline on a condition (Playwright's expect), never a
fixed sleep."""

import base64
import csv
import hashlib
import json
import re
import time
from urllib.parse import parse_qs, urlencode, urlparse

from conftest import DESKTOP, IDP_ORIGIN, assert_accessible, csp_violations, screenshot, sign_in, unique_user
from playwright.sync_api import expect

# The release timer fires within the minute after the payment deadline (Scheduler's
# minute precision), plus the release's own wait: generous on a loaded machine.
EXPIRY_DEADLINE_MS = 240_000
# An order awaiting payment: the grab's hold is the order, reserved until it settles.
OPEN_ORDER = re.compile(r"^reserved$")
# Stripe's test cards.
GOOD_CARD = "4242424242424242"
DECLINED_CARD = "4000000000000002"
AUTHENTICATION_CARD = "4000002500003155"


def buyer_page(open_page, stack, sale_id, user=None, **kwargs):
    page = open_page(f"/?sale={sale_id}", **kwargs)
    expect(page.get_by_test_id("signin-user")).to_be_visible()
    assert_accessible(page, "the sale page, signed out")
    sign_in(page, user or unique_user("buyer"))
    assert_accessible(page, "the sale page, signed in")
    return page


def assert_opened_at_the_start(page, starts_at):
    """The button opened at the start on the server's clock: not before, and promptly."""
    buy = page.locator("#buy")
    expect(buy).to_be_enabled(timeout=60_000)
    observed_ms = time.time() * 1000
    start_ms = starts_at.timestamp() * 1000
    # The test shares the server's clock (same machine): never open before the start.
    assert observed_ms >= start_ms, f"opened {start_ms - observed_ms:.0f} ms early"
    # And the page's own record of when it opened, on its estimate of server time:
    # after the start, within a few render ticks.
    opened_ms = float(buy.get_attribute("data-enabled-at-server-ms"))
    assert start_ms <= opened_ms <= start_ms + 3000, (opened_ms - start_ms)
    expect(page.get_by_test_id("countdown")).to_have_text("0:00")


def test_the_countdown_reaches_zero_with_the_button_disabled_and_it_opens_at_the_start(open_page, stack):
    sale_id, starts_at = stack.create_sale(stock=5, starts_in_s=15, prefix="countdown")
    page = buyer_page(open_page, stack, sale_id)
    countdown = page.get_by_test_id("countdown")
    # Counting down: a positive remaining time, and the button shut.
    expect(countdown).to_have_attribute("data-remaining-ms", re.compile(r"^[1-9]\d*$"))
    expect(page.locator("#buy")).to_be_disabled()
    expect(page.locator("#sale-status")).to_have_attribute("data-status", "upcoming")
    screenshot(page, "countdown")
    assert_opened_at_the_start(page, starts_at)
    expect(page.locator("#buy")).to_have_text("Buy now")


def test_a_clock_minutes_off_still_counts_down_to_the_servers_start(open_page, stack):
    skew_ms = 7 * 60 * 1000
    # The device's clock runs 7 minutes fast: Date (constructor and now()) is shifted.
    skewed_date = f"""
      (() => {{
        const Real = Date, skew = {skew_ms};
        class Skewed extends Real {{
          constructor(...args) {{ if (args.length) super(...args); else super(Real.now() + skew); }}
          static now() {{ return Real.now() + skew; }}
        }}
        globalThis.Date = Skewed;
      }})();
    """
    sale_id, starts_at = stack.create_sale(stock=5, starts_in_s=15, prefix="skew")
    page = open_page(f"/?sale={sale_id}", init_script=skewed_date)
    assert page.evaluate("Date.now()") - time.time() * 1000 > skew_ms - 60_000, "the page's clock is skewed"
    sign_in(page, unique_user("skewed"))
    countdown = page.get_by_test_id("countdown")
    expect(countdown).to_have_attribute("data-remaining-ms", re.compile(r"^[1-9]\d*$"))
    remaining_ms = int(countdown.get_attribute("data-remaining-ms"))
    true_remaining_ms = starts_at.timestamp() * 1000 - time.time() * 1000
    # Within a second of the truth, not 7 minutes off (which would have opened it already).
    assert abs(remaining_ms - true_remaining_ms) < 1500, (remaining_ms, true_remaining_ms)
    expect(page.locator("#buy")).to_be_disabled()
    assert_opened_at_the_start(page, starts_at)


def test_a_buyer_buys_and_pays(open_page, stack):
    sale_id, _ = stack.create_sale(stock=5, prefix="pay")
    page = buyer_page(open_page, stack, sale_id)
    # The sale's price, in its currency, as the buyer's locale writes it.
    expect(page.get_by_test_id("price")).to_have_text("€1,299.00")
    screenshot(page, "on-sale")
    page.locator("#buy").click()
    status = page.locator("#order-status")
    expect(status).to_have_attribute("data-status", "reserved")
    expect(status).to_have_text("Awaiting payment")
    expect(page.get_by_test_id("order-price")).to_have_text("Price: €1,299.00")
    expect(page.locator("#pay-countdown")).to_contain_text("Pay within")
    assert_accessible(page, "an order awaiting payment")
    screenshot(page, "awaiting-payment")
    page.locator("#pay").click()
    fill_card(page, GOOD_CARD)
    assert_accessible(page, "the card form")
    screenshot(page, "card-form")
    page.locator("#pay-card").click()
    expect(status).to_have_attribute("data-status", "paid")
    expect(page.locator("#pay")).to_be_hidden()
    expect(page.locator("#card-form")).to_be_hidden()
    expect(page.get_by_test_id("order-price")).to_have_text("Paid: €1,299.00")
    screenshot(page, "paid")
    # The money moved only once the order was paid: captured at Stripe, for the price.
    payment = stack.payment_of(page.locator("#order-id").inner_text())
    assert (payment["status"], payment["amount"], payment["currency"]) == ("succeeded", 129900, "eur"), payment
    # Units are left, but this buyer bought all one buyer may (1): the page says so
    # instead of offering a grab that can only be refused.
    expect(page.locator("#buy")).to_be_disabled()
    expect(page.locator("#buy")).to_have_text("Limit reached: 1 per buyer")
    assert_accessible(page, "a buyer at the per-user limit")
    stats = stack.stats(sale_id)
    assert (stats["paid"], stats["available"], stats["consistent"]) == (1, 4, True), stats


def test_a_shop_that_takes_no_cards_offers_no_pay_and_says_the_order_is_held(open_page, stack):
    """A deployment without card payments: its config.json names no Stripe.js."""
    def without_cards(context):
        def strip_stripe_js(route):
            response = route.fetch()
            config = response.json()
            config.pop("stripe_js", None)
            route.fulfill(response=response, json=config)

        context.route("**/config.json", strip_stripe_js)

    sale_id, _ = stack.create_sale(stock=2, prefix="nocards")
    page = buyer_page(open_page, stack, sale_id, prepare=without_cards)
    page.locator("#buy").click()
    expect(page.locator("#order-status")).to_have_attribute("data-status", "reserved")
    expect(page.locator("#no-payments")).to_be_visible()
    expect(page.locator("#pay")).to_be_hidden()
    expect(page.locator("#cancel")).to_be_visible()
    assert_accessible(page, "an order held where the shop takes no cards")


def card_form_of_a_held_order(open_page, stack, sale_id):
    """A buyer who holds a unit of the sale and pressed Pay: the page, and its order status."""
    page = buyer_page(open_page, stack, sale_id)
    page.locator("#buy").click()
    status = page.locator("#order-status")
    expect(status).to_have_attribute("data-status", "reserved")
    page.locator("#pay").click()
    return page, status


def fill_card(page, number):
    """Types a card into Stripe's card Element, as a buyer does."""
    expect(page.locator("#card-form")).to_be_visible()
    page.get_by_label("Card number").fill(number)
    page.get_by_label("Expiry month (MM)").fill("12")
    page.get_by_label("Expiry year (YY)").fill("34")
    page.get_by_label("Security code (CVC)").fill("123")
    page.get_by_label("Postal code").fill("75001")
    expect(page.locator("#pay-card")).to_have_text("Pay €1,299.00")


def open_my_orders(page):
    """Opens "Your orders" on the sale page: the list is read then, not on load."""
    page.locator("#my-orders summary").click()
    return page.locator("#my-orders-list li")


def test_another_device_finds_the_held_order_with_its_deadline_and_lists_the_buyers_orders(open_page, stack):
    sale_id, _ = stack.create_sale(stock=5, prefix="mine")
    buyer = unique_user("mine")
    first = buyer_page(open_page, stack, sale_id, user=buyer)
    first.locator("#buy").click()
    expect(first.locator("#order-status")).to_have_attribute("data-status", "reserved")
    order_id = first.locator("#order-id").inner_text()
    mine = open_my_orders(first)
    expect(mine).to_have_count(1)
    expect(mine).to_have_attribute("data-order-id", order_id)
    expect(mine).to_have_attribute("data-status", "reserved")

    # Another device (its own storage, nothing of the first tab's): Buy finds the buyer
    # at their limit, and the page shows the order they hold, its window counting down.
    other = buyer_page(open_page, stack, sale_id, user=buyer)
    other.locator("#buy").click()
    expect(other.locator("#order-status")).to_have_attribute("data-status", "reserved")
    expect(other.locator("#order-id")).to_have_text(order_id)
    expect(other.locator("#pay-countdown")).to_contain_text("Pay within")
    expect(other.locator("#pay")).to_be_enabled()
    listed = open_my_orders(other)
    expect(listed).to_have_attribute("data-status", "reserved")
    expect(listed.locator("time")).to_contain_text("pay by")
    assert_accessible(other, "the held order found on another device")
    # The site's front page lists them too, open, each linking to its sale.
    front = open_page("/")
    sign_in(front, buyer)
    row = front.locator("#my-orders-list li")
    expect(row).to_have_attribute("data-order-id", order_id)
    expect(row.get_by_role("link", name=sale_id)).to_have_attribute("href", f"?sale={sale_id}")
    assert_accessible(front, "the front page with the buyer's orders")
    # Another buyer sees none of them.
    stranger = buyer_page(open_page, stack, sale_id)
    expect(stranger.locator("#buy")).to_be_enabled()
    expect(open_my_orders(stranger)).to_have_count(0)
    expect(stranger.locator("#my-orders-empty")).to_be_visible()
    expect(stranger.locator("#order")).to_be_hidden()


def test_a_declined_card_is_said_so_and_the_order_still_awaits_payment(open_page, stack):
    sale_id, _ = stack.create_sale(stock=5, prefix="declined")
    page, status = card_form_of_a_held_order(open_page, stack, sale_id)
    fill_card(page, DECLINED_CARD)
    page.locator("#pay-card").click()
    expect(page.locator("#card-message")).to_have_text(re.compile("declined", re.IGNORECASE))
    expect(status).to_have_attribute("data-status", "reserved")
    assert_accessible(page, "a declined card")
    screenshot(page, "card-declined")
    # Another card, within the window: paid.
    fill_card(page, GOOD_CARD)
    page.locator("#pay-card").click()
    expect(status).to_have_attribute("data-status", "paid")
    expect(page.locator("#card-message")).to_be_hidden()
    stats = stack.stats(sale_id)
    assert (stats["paid"], stats["consistent"]) == (1, True), stats


def test_a_card_that_asks_for_authentication_pays_only_once_the_buyer_completes_it(open_page, stack):
    sale_id, _ = stack.create_sale(stock=5, prefix="threeds")
    page, status = card_form_of_a_held_order(open_page, stack, sale_id)
    fill_card(page, AUTHENTICATION_CARD)
    page.locator("#pay-card").click()
    # Stripe.js's authentication step (the local Stripe's stand-in for the bank's page).
    page.get_by_role("button", name="Fail authentication").click()
    # Stripe's own words for it, as Stripe.js gives them.
    expect(page.locator("#card-message")).to_have_text(re.compile("authenticat", re.IGNORECASE))
    expect(page.locator("#card-message")).to_be_visible()
    expect(status).to_have_attribute("data-status", "reserved")
    fill_card(page, AUTHENTICATION_CARD)
    page.locator("#pay-card").click()
    page.get_by_role("button", name="Complete authentication").click()
    expect(status).to_have_attribute("data-status", "paid")
    payment = stack.payment_of(page.locator("#order-id").inner_text())
    assert payment["status"] == "succeeded", payment


def test_a_card_cannot_be_paid_once_the_window_closed_and_no_money_moves(open_page, stack):
    # Long enough to open the form and type the card on a loaded machine.
    sale_id, _ = stack.create_sale(stock=1, payment_timeout_secs=20, prefix="latecard")
    page, status = card_form_of_a_held_order(open_page, stack, sale_id)
    fill_card(page, GOOD_CARD)
    # The buyer hesitates past the deadline: the form's button shuts with the window,
    # and the form goes once the order is released.
    expect(page.locator("#pay-card")).to_be_disabled(timeout=60_000)
    expect(page.locator("#pay-countdown")).to_contain_text("The payment window has closed")
    expect(status).to_have_attribute("data-status", "expired", timeout=EXPIRY_DEADLINE_MS)
    expect(page.locator("#card-form")).to_be_hidden()
    payment = stack.payment_of(page.locator("#order-id").inner_text())
    assert payment["status"] in ("requires_payment_method", "canceled"), payment
    assert payment.get("amount_received", 0) == 0, payment


def test_a_price_is_shown_with_its_own_currencys_decimals(open_page, stack):
    # JPY has no minor unit and BHD three (ISO 4217): the amounts are in those units.
    # MGA has two in ISO 4217 (none at Stripe, which is charged 1299) and ISK none (two,
    # always 00, at Stripe): the page shows ISO's, as the API gives them.
    for price, shown in [
        ({"amount": 1299, "currency": "JPY"}, "¥1,299"),
        ({"amount": 1290, "currency": "BHD"}, "BHD 1.290"),
        ({"amount": 129900, "currency": "MGA"}, "MGA 1,299.00"),
        ({"amount": 1300, "currency": "ISK"}, "ISK 1,300"),
    ]:
        sale_id, _ = stack.create_sale(stock=1, prefix="price", price=price)
        page = buyer_page(open_page, stack, sale_id)
        expect(page.get_by_test_id("price")).to_have_text(shown)


def test_a_sale_with_a_challenge_is_solved_in_a_worker_with_its_progress_shown_then_bought(open_page, stack):
    # Enough work to see the puzzle being solved (seconds in Chromium here), not minutes.
    sale_id, _ = stack.create_sale(stock=2, prefix="pow", per_user_limit=2, challenge_work=20_000)
    buyer = unique_user("solver")
    page = buyer_page(open_page, stack, sale_id, user=buyer)
    tokens = []
    page.on("request", lambda request: tokens.append(request) if request.url.endswith(f"/sales/{sale_id}/token") else None)
    # The worker's script is held until the solving state has been checked: the counter is
    # random, so an unheld solve can end within milliseconds, before the page is looked at.
    held_workers = []
    page.route("**/assets/challenge-worker.js", lambda route: held_workers.append(route))
    page.locator("#buy").click()
    puzzle = page.locator("#challenge")
    expect(page.locator("#message")).to_contain_text("Verifying you are a person")
    expect(puzzle).to_be_visible()
    expect(puzzle.get_by_label("Verifying you are a person")).to_be_attached()
    assert_accessible(page, "solving the challenge")
    for _ in range(200):  # the route's handler runs while Playwright waits
        if held_workers:
            break
        page.wait_for_timeout(50)
    assert len(held_workers) == 1, "the page starts one worker"
    held_workers[0].continue_()
    page.unroute("**/assets/challenge-worker.js")
    status = page.locator("#order-status")
    expect(status).to_have_attribute("data-status", "reserved", timeout=60_000)
    expect(puzzle).to_be_hidden()
    # The worker did the work (a counter per derivation) and the token carried it.
    derivations = int(puzzle.get_attribute("data-derivations"))
    assert 1 <= derivations <= 20_000, derivations
    assert len(tokens) == 1
    solved = tokens[0].post_data_json
    assert solved["solution"]["counter"] == derivations - 1
    order_id = page.locator("#order-id").text_content()

    # The same solution, replayed by hand: a path to the same order, never a second unit
    # (the buyer's limit is 2, so only the challenge stops it).
    token = stack.token(buyer)
    status_code, grant, _ = stack.call_until_answered("POST", f"/sales/{sale_id}/token", token=token, body=solved)
    assert status_code == 200, grant
    status_code, again, _ = stack.call_until_answered("POST", grant["grab_path"], token=token)
    assert (status_code, again["order_id"]) == (202, order_id), again
    stats = stack.stats(sale_id)
    assert (stats["reserved"], stats["available"]) == (1, 1), stats


def test_a_wrong_challenge_solution_is_refused_in_plain_words(open_page, stack):
    sale_id, _ = stack.create_sale(stock=1, prefix="forged", challenge_work=1_000)
    page = buyer_page(open_page, stack, sale_id)

    def forge(route):
        body = route.request.post_data_json
        body["solution"]["derivedKey"] = "00" * 32
        route.continue_(post_data=json.dumps(body))

    page.route(f"**/sales/{sale_id}/token", forge)
    page.locator("#buy").click()
    expect(page.locator("#message")).to_contain_text("The puzzle's answer was not accepted")
    expect(page.locator("#message")).to_have_attribute("data-kind", "error")
    assert_accessible(page, "a refused challenge solution")
    # Nothing was taken, and the button is back for another try.
    expect(page.locator("#buy")).to_be_enabled()
    assert stack.stats(sale_id)["available"] == 1


def test_the_time_left_to_pay_never_reads_more_than_there_is(open_page, stack):
    """An order whose deadline is 60.9 s away reads "Pay within 1:00", never 1:01: the
    server already rounds the deadline up to a whole second, and the page used to round
    the time left up again (a 60 s window read 1:01). The order's answer is rewritten in
    flight to that deadline (the first open answer sets it); every text the countdown
    shows is recorded."""
    sale_id, _ = stack.create_sale(stock=2, prefix="left")
    page = buyer_page(open_page, stack, sale_id)

    # One deadline for every answer: set when the first open order comes back.
    deadline = {}

    def with_deadline_ahead(route):
        answer = route.fetch()
        order = answer.json()
        if order.get("status") == "reserved":
            if "at" not in deadline:
                deadline_ms = time.time() * 1000 + 60_900
                deadline["at"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(deadline_ms / 1000)) + (
                    f".{int(deadline_ms % 1000):03d}Z"
                )
            order["expires_at"] = deadline["at"]
        route.fulfill(response=answer, json=order)

    page.route("**/orders/*", with_deadline_ahead)
    page.evaluate(
        """() => {
          window.payTexts = [];
          const countdown = document.querySelector("#pay-countdown");
          new MutationObserver(() => window.payTexts.push(countdown.textContent))
            .observe(countdown, { childList: true, characterData: true, subtree: true });
        }"""
    )
    page.locator("#buy").click()
    expect(page.locator("#pay-countdown")).to_have_text(re.compile(r"^Pay within 0:5\d$"), timeout=60_000)
    texts = page.evaluate("() => window.payTexts")
    shown = [text for text in texts if text.startswith("Pay within")]
    assert shown and "Pay within 1:01" not in shown, shown


def test_an_unpaid_order_expires_and_the_unit_comes_back(open_page, stack):
    sale_id, _ = stack.create_sale(stock=1, payment_timeout_secs=5, prefix="lapse")
    page = buyer_page(open_page, stack, sale_id)
    page.locator("#buy").click()
    status = page.locator("#order-status")
    expect(status).to_have_attribute("data-status", OPEN_ORDER)
    # The only unit is held: the cached status says sold out.
    expect(page.locator("#sale-status")).to_have_attribute("data-status", "sold_out")
    expect(status).to_have_attribute("data-status", "expired", timeout=EXPIRY_DEADLINE_MS)
    # The released unit brings the button back.
    expect(page.locator("#buy")).to_be_enabled()
    expect(page.locator("#stock")).to_have_text("1 of 1 left")
    screenshot(page, "expired")
    assert stack.stats(sale_id)["expired"] == 1


def test_two_buyers_race_for_the_last_unit_one_wins_the_other_sees_sold_out(open_page, stack):
    sale_id, _ = stack.create_sale(stock=1, prefix="race")
    pages = [buyer_page(open_page, stack, sale_id) for _ in range(2)]
    for page in pages:
        expect(page.locator("#buy")).to_be_enabled()
    # Both clicks are dispatched before either answer can arrive.
    for page in pages:
        page.evaluate("document.querySelector('#buy').click()")
    settled = """() => {
      const order = document.querySelector('#order-status').dataset.status;
      if (order === 'reserved') return true;
      return document.querySelector('#sale-status').dataset.status === 'sold_out'
        && document.querySelector('#buy').textContent === 'Sold out';
    }"""
    for page in pages:
        page.wait_for_function(settled, timeout=30_000)
    winners = [p for p in pages if OPEN_ORDER.match(p.locator("#order-status").get_attribute("data-status") or "")]
    assert len(winners) == 1, "exactly one buyer holds the last unit"
    loser = next(p for p in pages if p not in winners)
    expect(loser.locator("#order")).to_be_hidden()
    expect(loser.locator("#buy")).to_be_disabled()
    expect(loser.locator("#stock")).to_have_text("0 of 1 left")
    screenshot(loser, "sold-out")
    stats = stack.stats(sale_id)
    assert stats["available"] == 0 and stats["reserved"] == 1, stats


def test_a_429_storm_is_retried_with_the_same_grab_path_and_buys_once(open_page, stack):
    # Two per user: a retry that fetched a new path could buy a second unit here.
    sale_id, _ = stack.create_sale(stock=5, per_user_limit=2, prefix="storm")
    page = buyer_page(open_page, stack, sale_id)
    seen = []

    def storm(route):
        request = route.request
        seen.append((request.url, request.headers.get("x-retry-attempt")))
        n = len(seen)
        if n <= 3:
            # API Gateway's own throttling answer.
            route.fulfill(status=429, headers={"retry-after": "1"}, json={"message": "Too Many Requests"})
        elif n == 4:
            # The grab commits, but its answer is lost: the page sees a 503.
            route.fetch()
            route.fulfill(
                status=503,
                headers={"retry-after": "0"},
                json={"error": "unavailable", "message": "the service is busy; try again shortly"},
            )
        else:
            route.continue_()

    page.route("**/sales/*/grab/*", storm)
    page.locator("#buy").click()
    expect(page.locator("#order-status")).to_have_attribute("data-status", OPEN_ORDER)
    assert len(seen) == 5, seen
    assert len({url for url, _ in seen}) == 1, "every retry used the same grab path"
    assert [attempt for _, attempt in seen] == [None, "1", "2", "3", "4"]
    stats = stack.stats(sale_id)
    assert stats["reserved"] == 1, f"exactly one order: {stats}"
    assert stats["available"] == 4 and stats["consistent"], stats


def refuse_with(answer):
    return lambda route: route.fulfill(**answer)


def test_errors_read_as_plain_words(open_page, stack):
    page = open_page("/?sale=no-such-sale")
    expect(page.locator("#message")).to_have_text("There is no such sale. Check the link.")
    expect(page.locator("#buy")).to_be_disabled()
    assert_accessible(page, "an unknown sale's error")

    # The answers of the layers in front of the functions: API Gateway's own JSON, and
    # an HTML page from CloudFront.
    sale_id, _ = stack.create_sale(stock=1, prefix="errors")
    page = buyer_page(open_page, stack, sale_id)
    refusals = [
        ({"status": 401, "json": {"message": "Unauthorized"}}, "Please sign in again"),
        ({"status": 403, "body": "<html><body>Request blocked.</body></html>", "content_type": "text/html"},
         "network edge refused this request"),
        ({"status": 403, "json": {"error": "blocked", "message": "user is blocked"}}, "Your account is blocked"),
    ]
    for answer, message in refusals:
        page.route("**/sales/*/token", refuse_with(answer))
        page.locator("#buy").click()
        expect(page.locator("#message")).to_contain_text(message)
        assert_accessible(page, f"the refusal {message!r}")
        # A refusal gives the button back.
        expect(page.locator("#buy")).to_be_enabled()
        page.unroute("**/sales/*/token")

    # The edge's per-buyer limit (WAF) answers 429 with Retry-After: the page says why it
    # waits, waits it out, and buys once the edge lets it through.
    limited = {"status": 429, "headers": {"Retry-After": "1"},
               "json": {"error": "rate_limited", "message": "too many token and grab requests"}}
    refused = []

    def limit_once(route):
        if refused:
            route.continue_()
        else:
            refused.append(route.request.url)
            route.fulfill(**limited)

    page.route("**/sales/*/token", limit_once)
    page.locator("#buy").click()
    expect(page.locator("#message")).to_contain_text("Too many tries from you or your network")
    assert_accessible(page, "waiting out the edge's limit")
    expect(page.locator("#order-status")).to_have_attribute("data-status", "reserved", timeout=15_000)
    assert len(refused) == 1


def test_the_admin_creates_a_sale_and_watches_the_stats_move(open_page, stack):
    page = open_page("/admin.html", viewport=DESKTOP)
    expect(page.get_by_test_id("signin-user")).to_be_visible()
    assert_accessible(page, "the console, signed out")
    sign_in(page, "ops", admin=True)
    sale_id = f"admin-{unique_user('s')}"
    form = page.locator("#create")
    form.locator("[name=sale_id]").fill(sale_id)
    form.locator("[name=name]").fill("Console launch")
    form.locator("[name=price]").fill("49.99")
    form.locator("[name=currency]").fill("usd")
    expect(page.locator("#price-preview")).to_have_text("4999 USD minor units")
    form.locator("[name=stock]").fill("3")
    form.locator("[name=starts_in]").fill("0")
    # Open the longest of the session's sales: the first in the list, latest-ending first.
    form.locator("[name=open_for]").fill("6000")
    form.locator("[name=reserve]").select_option("take_then_hold")
    with page.expect_response(
        lambda r: r.url.endswith("/admin/sales") and r.request.method == "POST" and r.status == 201
    ) as created:
        form.locator("button[type=submit]").click()
    assert created.value.json()["reserve"] == "take_then_hold", created.value.json()
    expect(page.get_by_test_id("buyer-link")).to_have_attribute("href", re.compile(f"sale={sale_id}$"))
    expect(page.locator("#admin-message")).to_have_text(f"Created sale {sale_id} at $49.99.")
    expect(page.get_by_test_id("stats-price")).to_have_text("$49.99")
    # The list of sales has it first, with its status, its stock and its page.
    row = page.locator("#sales tr").first
    expect(row).to_have_attribute("data-sale", sale_id)
    expect(row.locator("td").nth(1)).to_have_text("Live")
    expect(row.locator("td").nth(2)).to_have_text("3 of 3")
    expect(row.get_by_role("link", name="Console launch")).to_have_attribute("href", re.compile(f"sale={sale_id}$"))
    status, view = stack.call("GET", f"/sales/{sale_id}")
    assert status == 200 and view["price"] == {"amount": 4999, "currency": "USD", "decimals": 2}, view
    available = page.locator("td[data-count=available]")
    expect(available).to_have_text("3")
    expect(page.locator("#consistent")).to_have_text("consistent")
    assert_accessible(page, "the console watching a sale")

    # A buyer grabs through the API; the console follows.
    buyer = stack.token(unique_user("fan"))
    status, grant, _ = stack.call_until_answered("POST", f"/sales/{sale_id}/token", token=buyer)
    assert status == 200, grant
    status, order, _ = stack.call_until_answered("POST", grant["grab_path"], token=buyer)
    assert status == 202, order
    expect(available).to_have_text("2")
    expect(page.locator("#chart")).to_have_attribute("data-points", re.compile(r"^([2-9]|\d\d+)$"))
    expect(page.locator("#consistent")).to_have_text("consistent")

    # Block and unblock a user.
    scalper = unique_user("scalper")
    page.locator("#block [name=user_id]").fill(scalper)
    page.locator("#block button").click()
    entry = page.locator(f"#blocked li[data-user='{scalper}']")
    expect(entry).to_be_visible()
    screenshot(page, "admin")
    admin = stack.token("ops", admin=True)
    assert scalper in stack.call_until_answered("GET", "/admin/blocklist", token=admin)[1]["users"]
    entry.get_by_role("button", name="Unblock").click()
    expect(entry).to_be_hidden()
    assert scalper not in stack.call_until_answered("GET", "/admin/blocklist", token=admin)[1]["users"]


def test_a_status_copy_from_before_the_pause_does_not_reopen_the_button(open_page, stack):
    sale_id, _ = stack.create_sale(stock=3, prefix="stalepause")
    page = buyer_page(open_page, stack, sale_id)
    expect(page.locator("#buy")).to_have_text("Buy now")
    # From now on every poll gets a CDN's copy of the status from before the pause.
    before = page.evaluate(f"fetch('/sales/{sale_id}').then((r) => r.json())")
    assert before["status"] == "active", before
    polls = []

    def stale_copy(route):
        polls.append(route.request.url)
        route.fulfill(json=before, headers={"cache-control": "max-age=1"})

    page.route(f"**/sales/{sale_id}", stale_copy)
    admin = stack.token("ops", admin=True)
    assert stack.call_until_answered("POST", f"/admin/sales/{sale_id}/pause", token=admin)[0] == 200
    # Past the grab function's refresh of its copy of the sale (SaleRefreshMs, 2 s).
    page.wait_for_timeout(2500)
    page.locator("#buy").click()
    expect(page.locator("#message")).to_contain_text("paused this sale")
    expect(page.locator("#buy")).to_have_text("Paused")
    polled, deadline = len(polls), time.monotonic() + 30
    while len(polls) < polled + 2:
        assert time.monotonic() < deadline, f"{len(polls) - polled} polls in 30 s"
        page.wait_for_timeout(250)
    # Two polls later, each answered with the copy from before: still paused, no button.
    expect(page.locator("#sale-status")).to_have_text("Paused")
    expect(page.locator("#buy")).to_be_disabled()
    assert stack.stats(sale_id)["reserved"] == 0


def test_the_operators_day_pause_a_live_sale_resume_it_end_it_and_export_its_paid_orders(open_page, stack):
    sale_id, _ = stack.create_sale(stock=3, prefix="paused")
    buyer_id = unique_user("buyer")
    buyer = buyer_page(open_page, stack, sale_id, user=buyer_id)
    expect(buyer.locator("#buy")).to_have_text("Buy now")

    console = open_page("/admin.html", viewport=DESKTOP)
    expect(console.get_by_test_id("signin-user")).to_be_visible()
    sign_in(console, "ops", admin=True)
    console.locator("#watch [name=sale_id]").fill(sale_id)
    console.locator("#watch button").click()
    state = console.get_by_test_id("control-state")
    expect(state).to_have_text("open")
    expect(console.locator("#audit li")).to_have_text(["Never paused or ended."])

    console.locator("#pause").click()
    expect(state).to_have_text("paused")
    expect(console.locator("#resume")).to_be_enabled()
    expect(console.locator("#pause")).to_be_disabled()
    expect(console.locator("#audit li").first).to_have_attribute("data-action", "pause")
    expect(console.locator("#audit li").first).to_contain_text("paused by ops")
    assert_accessible(console, "the console with a paused sale")
    # The buyer's page follows on its next poll of the sale: paused, no button to press.
    expect(buyer.locator("#sale-status")).to_have_text("Paused")
    expect(buyer.locator("#buy")).to_be_disabled()
    expect(buyer.locator("#buy")).to_have_text("Paused")
    assert_accessible(buyer, "the sale page of a paused sale")
    screenshot(buyer, "paused")

    console.locator("#resume").click()
    expect(state).to_have_text("open")
    expect(buyer.locator("#buy")).to_have_text("Buy now")
    # The grab function's copy of the sale may still say paused for up to a refresh
    # (2 s): the page then shows it paused until its next poll, and the buyer presses
    # again once the button is back.
    status = buyer.locator("#order-status")
    deadline = time.monotonic() + 60
    while True:
        expect(buyer.locator("#buy")).to_be_enabled()
        buyer.locator("#buy").click()
        try:
            expect(status).to_have_text("Awaiting payment", timeout=5_000)
            break
        except AssertionError:
            assert time.monotonic() < deadline, "the resumed sale never sold"
    buyer.locator("#pay").click()
    fill_card(buyer, GOOD_CARD)
    buyer.locator("#pay-card").click()
    expect(status).to_have_attribute("data-status", "paid")
    order_id = buyer.locator("#order-id").inner_text()

    console.once("dialog", lambda dialog: dialog.accept())
    console.locator("#end").click()
    expect(state).to_have_text("ended")
    for action in ("pause", "resume", "end"):
        expect(console.locator(f"#{action}")).to_be_disabled()
    expect(console.locator("#audit li")).to_have_count(3)
    actions = [item.get_attribute("data-action") for item in console.locator("#audit li").all()]
    assert actions == ["end", "resume", "pause"], actions
    expect(buyer.locator("#sale-status")).to_have_text("Ended")
    admin = stack.token("ops", admin=True)
    stats = stack.call_until_answered("GET", f"/admin/sales/{sale_id}/stats", token=admin)[1]
    assert (stats["paid"], stats["available"], stats["consistent"]) == (1, 2, True), stats

    # The paid orders, for the warehouse: one file, as many rows as the stats count paid.
    with console.expect_download() as downloaded:
        console.locator("#download-orders").click()
    assert downloaded.value.suggested_filename == f"{sale_id}-paid-orders.csv"
    with open(downloaded.value.path(), newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == stats["paid"], rows
    assert rows[0] == {
        "order_id": order_id,
        "buyer": buyer_id,
        "status": "paid",
        "payment": "captured",
        "amount": "129900",
        "currency": "EUR",
        "price": "1299.00",
        "paid_at": rows[0]["paid_at"],
    }, rows
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", rows[0]["paid_at"]), rows
    expect(console.locator("#admin-message")).to_have_text(f"Downloaded 1 paid order of {sale_id}.")


def test_deployed_sign_in_is_the_authorization_code_flow_with_pkce_and_no_secret(open_page, stack):
    """The OIDC provider is played by route interception: it checks what the page sends
    and hands back an ID token the local authorizer accepts."""
    idp = IDP_ORIGIN
    user = unique_user("oidc")
    config = {
        "auth": "oidc",
        "client_id": "flashsale-web",
        "authorize_url": f"{idp}/oauth2/authorize",
        "token_url": f"{idp}/oauth2/token",
    }
    sale_id, _ = stack.create_sale(stock=1, prefix="oidc")
    seen = {}

    def authorize(route):
        query = {k: v[0] for k, v in parse_qs(urlparse(route.request.url).query).items()}
        seen["authorize"] = query
        back = f"{query['redirect_uri']}?" + urlencode({"code": "the-code", "state": query["state"]})
        route.fulfill(status=302, headers={"location": back})

    def token(route):
        form = {k: v[0] for k, v in parse_qs(route.request.post_data).items()}
        seen["token"] = form
        route.fulfill(
            status=200,
            headers={"access-control-allow-origin": "*"},
            json={"id_token": stack.token(user), "token_type": "Bearer", "expires_in": 3600},
        )

    page = open_page("/admin.html")
    page.route("**/config.json", lambda route: route.fulfill(json=config))
    page.route(f"{idp}/oauth2/authorize*", authorize)
    page.route(f"{idp}/oauth2/token", token)
    page.goto(f"{stack.url}/?sale={sale_id}")
    page.get_by_role("button", name="Sign in", exact=True).click()
    expect(page.get_by_test_id("signed-in-as")).to_contain_text(user)
    # Back on the sale it started from, with the code gone from the address.
    assert page.url == f"{stack.url}/?sale={sale_id}"
    expect(page.locator("#buy")).to_be_enabled()

    asked = seen["authorize"]
    assert asked["response_type"] == "code" and asked["client_id"] == "flashsale-web"
    assert asked["code_challenge_method"] == "S256"
    traded = seen["token"]
    assert traded["grant_type"] == "authorization_code" and traded["code"] == "the-code"
    assert traded["redirect_uri"] == asked["redirect_uri"]
    assert "client_secret" not in traded
    # The verifier sent with the code is the one the challenge was made from.
    digest = hashlib.sha256(traded["code_verifier"].encode()).digest()
    assert base64.urlsafe_b64encode(digest).rstrip(b"=").decode() == asked["code_challenge"]
    assert 43 <= len(traded["code_verifier"]) <= 128


def test_the_pages_run_under_a_policy_that_refuses_an_injected_script(open_page, stack):
    """The pages' own scripts, styles and calls pass their Content-Security-Policy (every
    test fails on a violation at its end); a script injected into a page does not run."""
    for path in ("/", "/admin.html"):
        page = open_page(path)
        csp = page.request.get(stack.url + path).headers["content-security-policy"]
        for directive in ("script-src 'self'", "frame-ancestors 'none'", f"connect-src 'self' {IDP_ORIGIN}"):
            assert directive in csp, csp
        expect(page.get_by_test_id("signin-user")).to_be_visible()
        page.evaluate(
            """() => {
              const injected = document.createElement("script");
              injected.textContent = "window.injectedRan = true";
              document.head.append(injected);
            }"""
        )
        violations = csp_violations(page)
        deadline = time.monotonic() + 10
        while not violations and time.monotonic() < deadline:
            page.wait_for_timeout(50)
        assert page.evaluate("() => window.injectedRan") is None, "the injected script ran"
        assert violations and all("script-src-elem refused inline" in v for v in violations), violations
        # Only this refusal was expected; the end-of-test check looks for any other.
        violations.clear()
