"""The browser tests' fixtures: one local stack (the real `flashsale-local` binary on free
ports, its own emulators), headless Debian Chromium driven by Playwright, and helpers to
call the API directly (as an admin, or as a second buyer).

Run by `make browser-test`, which builds the binary and installs the tools first.
"""

import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect, sync_playwright

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("FLASHSALE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# DynamoDB Local (Java) and moto start slowly on a loaded machine.
STACK_START_DEADLINE_S = 300
# How long a direct API call keeps retrying busy answers.
BUSY_DEADLINE_S = 60
AXE = Path(os.environ.get("FLASHSALE_AXE", ROOT / ".tools" / "axe" / "node_modules" / "axe-core" / "axe.min.js"))
# The impacts that fail a page: axe's two worst of four (minor and moderate are reported).
FAILING_IMPACTS = ("critical", "serious")
SCREENSHOTS = ROOT / "docs" / "screenshots"
SCREENSHOT_SCRATCH = ROOT / "target" / "browser-screenshots"
PHONE = {"width": 412, "height": 800}
DESKTOP = {"width": 1100, "height": 1000}

# The local stack's Stripe test key (infra/local/src/local_stripe.rs).
LOCAL_STRIPE_SECRET_KEY = "sk_test_flashsale_local"

# The origin of the identity provider that test_sale_page's sign-in test plays.
IDP_ORIGIN = "https://idp.example.test"

# Reports every Content-Security-Policy violation of every document a page shows to the
# test (a binding outlives navigations, where a list on `window` would not). Playwright
# injects init scripts outside the page's own policy, as it injects axe-core below: a
# <script> tag added to the page would itself be refused by `script-src 'self'`.
CSP_RECORDER = """
document.addEventListener("securitypolicyviolation", (event) => {
  window.reportCspViolation(`${event.effectiveDirective} refused ${event.blockedURI || "inline"} at ${event.sourceFile}:${event.lineNumber}`);
});
"""

# Playwright's expect() polls; these are deadlines, not waits.
expect.set_options(timeout=30_000)


class LocalStack:
    """The `flashsale-local` process and the API it serves."""

    def __init__(self, binary: Path):
        self.binary = binary
        self.process = None
        self.url = None
        self.stripe_url = None
        self.output = []

    def start(self):
        stack_name = f"browser-{os.getpid()}"
        self.process = subprocess.Popen(
            [
                str(self.binary),
                "--template", str(ROOT / "template.yaml"),
                "--stack-name", stack_name,
                "--api-port", "0",
                "--dynamodb-port", "0",
                "--moto-port", "0",
                "--sqs-port", "0",
                "--stripe-port", "0",
                "--parameter-overrides",
                "GrabThrottleRateLimit=60", "GrabThrottleBurstLimit=30",
                # The identity provider the sign-in test plays: the pages' policy lets
                # them post to its token endpoint, as a deployed stack's names its own.
                f"IdentityProviderOrigin={IDP_ORIGIN}",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            # Its own process group: if it ever ignores SIGTERM, the group is killed.
            start_new_session=True,
        )
        found = threading.Event()

        def drain():
            # Keeps reading for the whole run, so the pipe never fills and blocks it.
            for line in self.process.stdout:
                self.output.append(line)
                stripe = re.search(r"Stripe\s+(http://\S+)", line)
                if stripe:
                    self.stripe_url = stripe.group(1)
                match = re.search(r"HTTP API\s+(http://\S+)", line)
                if match and not found.is_set():
                    self.url = match.group(1)
                    found.set()

        threading.Thread(target=drain, daemon=True).start()
        deadline = time.monotonic() + STACK_START_DEADLINE_S
        while not found.wait(0.5):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("flashsale-local did not start:\n" + "".join(self.output[-60:]))

    def stop(self):
        if self.process is None or self.process.poll() is not None:
            return
        # SIGTERM: the stack stops its tasks and the emulators it started.
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    # ------------------------------------------------------------ the API, directly

    def call(self, method, path, token=None, body=None, headers=None):
        request = urllib.request.Request(self.url + path, method=method)
        if token:
            request.add_header("authorization", f"Bearer {token}")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            request.add_header("content-type", "application/json")
        try:
            with urllib.request.urlopen(request, data=data, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")

    def call_until_answered(self, method, path, **kwargs):
        """`call`, again while the answer is busy (503) or throttled (429), as any client
        of the API must: DynamoDB Local on a loaded machine is sometimes busy."""
        deadline = time.monotonic() + BUSY_DEADLINE_S
        attempt = 0
        while True:
            status, body = self.call(method, path, **kwargs)
            if status not in (429, 503) or time.monotonic() > deadline:
                return status, body, attempt
            attempt += 1
            time.sleep(min(2.0, 0.2 * attempt))

    def payment_of(self, order_id):
        """The order's PaymentIntent as the local Stripe has it (the operator's view in
        Stripe's dashboard), found by the order id its metadata carries."""
        request = urllib.request.Request(f"{self.stripe_url}/v1/payment_intents?limit=100")
        request.add_header("authorization", f"Bearer {LOCAL_STRIPE_SECRET_KEY}")
        with urllib.request.urlopen(request, timeout=30) as response:
            intents = json.loads(response.read())["data"]
        found = [i for i in intents if i.get("metadata", {}).get("order_id") == order_id]
        assert len(found) == 1, f"{len(found)} payments name {order_id}"
        return found[0]

    def token(self, user_id, admin=False):
        status, body = self.call("POST", "/local/token", body={"user_id": user_id, "admin": admin})
        assert status == 200, body
        return body["token"]

    def create_sale(self, *, stock, starts_in_s=-1, payment_timeout_secs=600, per_user_limit=1, prefix="sale",
                    challenge_work=0, price=None):
        """A sale of its own for one test; starts `starts_in_s` from now (whole seconds), at
        `price` (the API's `{amount, currency}`; 1,299.00 EUR by default)."""
        sale_id = f"{prefix}-{uuid.uuid4().hex[:10]}"
        now = datetime.now(timezone.utc).replace(microsecond=0)
        starts_at = now + timedelta(seconds=starts_in_s)
        body = {
            "sale_id": sale_id,
            "name": f"Phone drop {sale_id[-4:]}",
            "price": price or {"amount": 129900, "currency": "EUR"},
            "stock": stock,
            "starts_at": iso(starts_at),
            "ends_at": iso(starts_at + timedelta(hours=1)),
            "per_user_limit": per_user_limit,
            "payment_timeout_secs": payment_timeout_secs,
            "challenge_work": challenge_work,
        }
        admin = self.token("ops", admin=True)
        status, answer, retries = self.call_until_answered("POST", "/admin/sales", token=admin, body=body)
        # A busy answer may have hidden a sale that was created: then it is ours.
        assert status == 201 or (retries and answer.get("error") == "sale_exists"), answer
        return sale_id, starts_at

    def stats(self, sale_id):
        status, body, _ = self.call_until_answered(
            "GET", f"/admin/sales/{sale_id}/stats", token=self.token("ops", admin=True)
        )
        assert status == 200, body
        return body


def iso(moment):
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture(scope="session")
def stack():
    binary = Path(os.environ.get("FLASHSALE_LOCAL_BIN", ROOT / "target" / "debug" / "flashsale-local"))
    assert binary.is_file(), f"{binary} is missing: `make debug-build` (make browser-test runs it)"
    local = LocalStack(binary)
    local.start()
    yield local
    local.stop()


@pytest.fixture(scope="session")
def browser():
    assert Path(CHROMIUM).is_file(), f"{CHROMIUM} is missing: apt-get install chromium (make browser-tools does)"
    with sync_playwright() as playwright:
        # Playwright gives every launch a fresh, temporary user-data-dir of its own.
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


def csp_violations(page: Page):
    """The Content-Security-Policy violations the page's documents reported so far, as
    "url: directive refused what at where" (a list the test may clear)."""
    return page.context.csp_violations


def assert_no_csp_violation(page: Page, state):
    """Fails if the page reported any Content-Security-Policy violation so far."""
    violations = csp_violations(page)
    assert violations == [], f"{state} ({page.url}): CSP violations: {violations}"


def assert_accessible(page: Page, state):
    """Runs axe-core on the page as it is now and fails on any critical or serious
    violation, naming the rule, the impact and the elements."""
    assert page.evaluate("() => typeof window.axe === 'object'"), "axe-core is injected by open_page"
    result = page.evaluate("() => axe.run(document, { resultTypes: ['violations'] })")
    failing = [
        f"{violation['id']} ({violation['impact']}): {violation['help']} at "
        + ", ".join(" ".join(node["target"]) for node in violation["nodes"][:5])
        for violation in result["violations"]
        if violation["impact"] in FAILING_IMPACTS
    ]
    assert not failing, f"{state} ({page.url}): " + "; ".join(failing)


@pytest.fixture
def open_page(browser, stack):
    """Opens a page of the local stack in a fresh context (its own storage: one user).
    Every page still open when the test ends is scanned with axe-core as it is then, and
    must have reported no Content-Security-Policy violation."""
    assert AXE.is_file(), f"{AXE} is missing: npm install axe-core (make browser-tools does)"
    contexts = []
    pages = []

    def open_(path, viewport=PHONE, init_script=None, prepare=None):
        # One locale, so that prices read the same on every machine: "€1,299.00".
        context = browser.new_context(viewport=viewport, device_scale_factor=1, locale="en-US")
        contexts.append(context)
        context.add_init_script(path=str(AXE))
        context.csp_violations = []
        context.expose_binding(
            "reportCspViolation",
            lambda source, text: source["context"].csp_violations.append(f"{source['page'].url}: {text}"),
        )
        context.add_init_script(CSP_RECORDER)
        if init_script:
            context.add_init_script(init_script)
        if prepare:
            prepare(context)
        page = context.new_page()
        page.goto(stack.url + path)
        pages.append(page)
        return page

    yield open_
    try:
        for page in pages:
            if not page.is_closed():
                assert_no_csp_violation(page, "the page at the end of the test")
                assert_accessible(page, "the page at the end of the test")
    finally:
        for context in contexts:
            context.close()


def sign_in(page: Page, user_id, admin=False):
    page.get_by_test_id("signin-user").fill(user_id)
    page.get_by_test_id("signin-admin").set_checked(admin)
    page.get_by_test_id("signin-submit").click()
    expect(page.get_by_test_id("signed-in-as")).to_contain_text(user_id)


def screenshot(page: Page, name):
    """Always into target/; into docs/screenshots/ too when UPDATE_SCREENSHOTS=1."""
    SCREENSHOT_SCRATCH.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT_SCRATCH / f"{name}.png"), full_page=True)
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def unique_user(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


