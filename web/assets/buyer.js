// The buyer's sale page: `/?sale=<id>`.
//
// Waiting costs no request: the countdown runs on the server's clock (clock.js), learnt
// from the cached sale status, which is polled slowly. The button opens at the start,
// closes on click, fetches the grab path once and grabs with it, retrying throttled or
// busy answers with the same path (so a retry can never buy a second unit). Sold out,
// seen in the cached status, stops the retries; the status is still polled slowly and
// the button comes back if a unit is released.

import { $, call, formatDuration, formatPrice, humanMessage, isRetryable, sleep, untilAnswered } from "./api.js";
import { completeProviderSignIn, currentSession, renderSignIn } from "./auth.js";
import { openCardForm, takesCards } from "./card.js";
import { ServerClock, servedFromCache } from "./clock.js";

const FINAL = new Set(["paid", "cancelled", "expired", "refunded", "payment_failed"]);
const MAX_GRAB_ATTEMPTS = 40;

/** From `?sale=`, read once the provider's sign-in answer is off the address. */
let saleId = null;
const clock = new ServerClock();
const ui = {
  name: $("#sale-name"),
  price: $("#price"),
  status: $("#sale-status"),
  stock: $("#stock"),
  countdown: $("#countdown"),
  countdownLabel: $("#countdown-label"),
  buy: $("#buy"),
  message: $("#message"),
  challenge: $("#challenge"),
  challengeProgress: $("#challenge-progress"),
  order: $("#order"),
  orderStatus: $("#order-status"),
  orderId: $("#order-id"),
  orderPrice: $("#order-price"),
  payCountdown: $("#pay-countdown"),
  noPayments: $("#no-payments"),
  pay: $("#pay"),
  cancel: $("#cancel"),
  cardForm: $("#card-form"),
  cardField: $("#card-field"),
  cardMessage: $("#card-message"),
  payCard: $("#pay-card"),
  myOrders: $("#my-orders"),
  myOrdersDetails: $("#my-orders-details"),
  myOrdersList: $("#my-orders-list"),
  myOrdersEmpty: $("#my-orders-empty"),
  myOrdersMore: $("#my-orders-more"),
};

const state = {
  session: null,
  sale: null,
  /** "idle" | "grabbing" | "order" */
  phase: "idle",
  order: null,
  /** Set by the status poll; ends a retry loop at once. */
  soldOut: false,
  /** Server time at which a grab last answered sold_out. */
  soldOutAt: -Infinity,
  /** Server time at which a request last answered sale_paused. */
  pausedAt: -Infinity,
  /** A grab answered limit_reached: this buyer holds or bought all one buyer may. */
  atLimit: false,
  enabledOnce: false,
  /** The open card form (card.js), while the buyer pays by card. */
  card: null,
  /** Whether this deployment takes card payments (its config.json names Stripe.js). */
  takesCards: false,
};

function say(text, kind = "info") {
  ui.message.textContent = text || "";
  ui.message.dataset.kind = kind;
  ui.message.hidden = !text;
}

function orderKey() {
  return `flashsale.order.${saleId}.${state.session?.user}`;
}

/** The orders this buyer paid for in this sale, as far as this tab has seen. */
function paidKey() {
  return `flashsale.paid.${saleId}.${state.session?.user}`;
}

function paidOrders() {
  try {
    return new Set(JSON.parse(sessionStorage.getItem(paidKey()) || "[]"));
  } catch {
    return new Set();
  }
}

/**
 * Whether the buyer holds or bought as many units as one buyer may (the sale's
 * per_user_limit): paid orders count, as the open one does, and a grab that answered
 * limit_reached says so for orders this tab has not seen.
 */
function atTheLimit() {
  const limit = state.sale?.per_user_limit;
  if (state.atLimit) return true;
  if (!limit) return false;
  const open = state.order && !FINAL.has(state.order.status) ? 1 : 0;
  return paidOrders().size + open >= limit;
}

// ---------------------------------------------------------------- the sale status

/** Polls the status at once (an order just gave its unit back). */
let pollNow = () => {};

async function pollStatus() {
  for (;;) {
    const sentAt = performance.now();
    const result = await call(`/sales/${encodeURIComponent(saleId)}`);
    const receivedAt = performance.now();
    let next = 5000;
    if (result.ok) {
      clock.sample(Date.parse(result.data.server_time), sentAt, receivedAt, servedFromCache(result.headers));
      showSale(result.data);
      // Poll a little faster while a unit can be bought (to follow the stock); slowly
      // before the start (the clock does the counting) and once sold out.
      next = result.data.status === "active" ? 2000 : result.data.status === "ended" ? 30000 : 5000;
    } else if (result.data?.error === "sale_not_found") {
      ui.name.textContent = "No such sale";
      say(humanMessage(result), "error");
      next = 15000;
    } else {
      say(humanMessage(result), "error");
    }
    // +-20% so that a crowd that loaded the page together does not poll together.
    const early = new AbortController();
    pollNow = () => early.abort();
    await sleep(next * (0.8 + 0.4 * Math.random()), early.signal);
  }
}

function showSale(sale) {
  state.sale = sale;
  document.title = `${sale.name} - flashsale`;
  ui.name.textContent = sale.name;
  // A sale created before sales had prices has none: nothing is shown.
  ui.price.textContent = formatPrice(sale.price);
  ui.price.hidden = !sale.price;
  const soldOut = sale.status === "sold_out" || sale.stock_available <= 0;
  // A cached status older than a grab that heard sold_out, or sale_paused, is not news.
  const copiedAt = Date.parse(sale.server_time);
  state.soldOut = copiedAt < state.soldOutAt || (soldOut && sale.status !== "upcoming");
  if (copiedAt < state.pausedAt && sale.status !== "ended") state.sale = { ...sale, status: "paused" };
  // A retry notice is stale once no grab is running.
  if (state.phase === "idle" && ui.message.dataset.kind === "wait") say("");
  render();
}

// ---------------------------------------------------------------- the button

function saleLabel(now) {
  const sale = state.sale;
  if (!sale || !clock.synced) return { status: "loading", text: "Loading..." };
  const startsAt = Date.parse(sale.starts_at);
  const endsAt = Date.parse(sale.ends_at);
  if (sale.status === "ended" || now >= endsAt) return { status: "ended", text: "Ended" };
  if (sale.status === "paused") return { status: "paused", text: "Paused" };
  if (now < startsAt) return { status: "upcoming", text: "Starts soon" };
  if (state.soldOut) return { status: "sold_out", text: "Sold out" };
  return { status: "active", text: "On sale now" };
}

function render() {
  const now = clock.now();
  const label = saleLabel(now);
  ui.status.textContent = label.text;
  ui.status.dataset.status = label.status;
  if (state.sale) {
    // A grab that heard sold_out knows better than a status copy still showing stock.
    const available = state.soldOut ? 0 : Math.max(0, state.sale.stock_available);
    ui.stock.textContent = `${available} of ${state.sale.stock_total} left`;
  }
  if (state.sale && clock.synced) {
    const remaining = Date.parse(state.sale.starts_at) - now;
    ui.countdown.dataset.remainingMs = String(Math.round(remaining));
    ui.countdown.textContent = formatDuration(remaining);
    ui.countdownLabel.textContent = remaining > 0 ? "Starts in" : "Started";
  }

  const limited = state.phase === "idle" && !!state.session && atTheLimit();
  const open = label.status === "active" && state.phase === "idle" && !!state.session && !limited;
  if (open && !state.enabledOnce) {
    // When the button first opened, on the server's clock: the tests hold it against
    // the sale's start.
    state.enabledOnce = true;
    ui.buy.dataset.enabledAtServerMs = String(Math.round(now));
  }
  ui.buy.disabled = !open;
  ui.buy.textContent =
    state.phase === "grabbing"
      ? "Getting your unit..."
      : state.phase === "order"
        ? "Your order is below"
      : label.status === "sold_out"
        ? "Sold out"
        : label.status === "ended"
          ? "Sale ended"
        : label.status === "paused"
          ? "Paused"
          : limited
            ? (state.sale?.per_user_limit ? `Limit reached: ${state.sale.per_user_limit} per buyer` : "Limit reached")
          : !state.session
            ? "Sign in to buy"
            : label.status === "upcoming" || label.status === "loading"
              ? "Not yet"
              : "Buy now";

  if (state.order) renderOrder(now);
}

// ---------------------------------------------------------------- grabbing

async function buy() {
  if (ui.buy.disabled) return;
  state.phase = "grabbing";
  render();
  say("");
  const session = state.session;

  // A sale that asks for a challenge: solve it first; the solution buys the path.
  let solution;
  if (state.sale?.challenge_work > 0) {
    const solved = await solveChallenge(session);
    if (!solved.ok) return grabFailed(solved);
    solution = solved.payload;
  }
  const pass = await withRetries(() =>
    call(`/sales/${encodeURIComponent(saleId)}/token`, { method: "POST", token: session.token, body: solution }),
  );
  if (!pass.ok) return grabFailed(pass);

  // One path for every retry: it names the order it creates, so a retry after a lost
  // answer gets the same order back rather than a second unit.
  const grabPath = pass.data.grab_path;
  let ambiguous = false;
  const grab = await withRetries(
    (attempt) =>
      call(grabPath, {
        method: "POST",
        token: session.token,
        headers: attempt > 0 ? { "x-retry-attempt": String(attempt) } : {},
      }),
    {
      onResult(result) {
        // No answer, or a busy function: the grab may have committed.
        if (result.status === 0 || result.status === 503) ambiguous = true;
      },
      // A grab that may have committed asks once more after sold out: the server
      // answers a committed path with its order, else sold_out.
      stopWhen: () => state.soldOut && !ambiguous,
    },
  );
  if (grab.status === 202) {
    startOrder(grab.data);
    return;
  }
  grabFailed(grab);
}

const SOLD_OUT = { ok: false, status: 409, data: { error: "sold_out" }, headers: new Headers() };
const SALE_PAUSED = { ok: false, status: 409, data: { error: "sale_paused" }, headers: new Headers() };

/**
 * Fetches this buyer's challenge and solves it in a Web Worker, showing how far the
 * search is (the share of the most counters it can take: it ends anywhere before).
 * Answers `{ ok, payload }` for the token request, or the failed call.
 */
async function solveChallenge(session) {
  const issued = await withRetries(() =>
    call(`/sales/${encodeURIComponent(saleId)}/challenge`, { token: session.token }),
  );
  if (!issued.ok) return issued;
  const challenge = issued.data;
  ui.challenge.hidden = false;
  ui.challengeProgress.value = 0;
  say("Verifying you are a person: your browser is solving a small puzzle that keeps bots out.", "wait");
  const worker = new Worker("assets/challenge-worker.js");
  try {
    const answer = await new Promise((resolve) => {
      worker.onmessage = ({ data }) => {
        if (data.progress != null) ui.challengeProgress.value = data.progress;
        if (data.solution || data.error) resolve(data);
      };
      worker.onerror = (event) => resolve({ error: event.message || "the puzzle could not run" });
      worker.postMessage(challenge);
    });
    if (answer.error) {
      return { ok: false, status: 0, data: { message: `The puzzle could not be solved: ${answer.error}` }, headers: new Headers() };
    }
    ui.challengeProgress.value = 1;
    ui.challenge.dataset.derivations = String(answer.derivations);
    say("");
    return { ok: true, payload: { challenge, solution: answer.solution } };
  } finally {
    worker.terminate();
    ui.challenge.hidden = true;
  }
}

/**
 * A token or grab request, tried again while throttled or busy (and, a few times, while
 * the server says the sale has not quite started: clocks agree to within the round
 * trip). Sold out or paused, seen by the status poll meanwhile, ends it.
 */
async function withRetries(request, { onResult, stopWhen = () => !!seenMeanwhile() } = {}) {
  const result = await untilAnswered(request, {
    attempts: MAX_GRAB_ATTEMPTS,
    retryable: (r, attempt) => isRetryable(r) || (r.status === 425 && attempt < 5),
    stop: stopWhen,
    onResult,
    onWait: (r, attempt) =>
      say(r.status === 425 ? humanMessage(r) : `${humanMessage(r)} (attempt ${attempt + 1})`, "wait"),
  });
  return isRetryable(result) && stopWhen() ? seenMeanwhile() || SOLD_OUT : result;
}

/** What the status poll learnt while a request was being retried, as the answer it stands for. */
function seenMeanwhile() {
  if (state.sale?.status === "paused") return SALE_PAUSED;
  return state.soldOut ? SOLD_OUT : null;
}

function grabFailed(result) {
  state.phase = "idle";
  if (result.data?.error === "sold_out") {
    state.soldOut = true;
    state.soldOutAt = clock.now();
  }
  if (result.data?.error === "limit_reached") {
    state.atLimit = true;
    findHeldOrder();
  }
  // Paused: the button waits for the status poll to say the sale is back, rather than
  // offering a grab that can only be refused again.
  if (result.data?.error === "sale_paused" && state.sale) {
    state.sale = { ...state.sale, status: "paused" };
    state.pausedAt = clock.now();
    pollNow();
  }
  say(humanMessage(result), result.data?.error === "sold_out" ? "info" : "error");
  render();
}

// ---------------------------------------------------------------- the order

function startOrder(order) {
  say("");
  followHere({ ...order, sale_id: saleId });
  refreshMyOrders();
}

/** Shows `order` as this page's order and follows it to its end. */
function followHere(order) {
  state.phase = "order";
  state.order = order;
  sessionStorage.setItem(orderKey(), order.order_id);
  render();
  followOrder(order.order_id);
}

let following = null;

async function followOrder(orderId) {
  // This loop's own token: a loop of an earlier call for the same order, waking from
  // its sleep, sees another and ends.
  const loop = { orderId };
  following = loop;
  while (following === loop) {
    const result = await call(`/orders/${encodeURIComponent(orderId)}`, { token: state.session?.token });
    if (following !== loop) return;
    if (result.ok) {
      updateOrder(result.data);
      if (FINAL.has(result.data.status)) return;
    } else if (result.data?.error === "order_not_found" && state.order?.status !== "reserved") {
      say(humanMessage(result), "error");
      return endOrder();
    } else if (!result.ok && result.data?.error !== "order_not_found") {
      say(humanMessage(result), "error");
    }
    const status = state.order?.status;
    await sleep(status === "reserved" ? 1000 : 3000);
  }
}

function updateOrder(order) {
  state.order = { ...state.order, ...order };
  if (order.status === "paid") {
    const paid = paidOrders();
    paid.add(state.order.order_id);
    sessionStorage.setItem(paidKey(), JSON.stringify([...paid]));
  }
  if (FINAL.has(order.status)) {
    sessionStorage.removeItem(orderKey());
    state.phase = "idle";
    // Its unit is back on sale (expired, cancelled): show the stock now.
    if (order.status !== "paid") pollNow();
    refreshMyOrders();
  }
  render();
}

function endOrder() {
  closeCard();
  following = null;
  sessionStorage.removeItem(orderKey());
  state.order = null;
  state.phase = "idle";
  render();
}

const ORDER_TEXT = {
  reserved: "Awaiting payment",
  paid: "Paid - it is yours!",
  expired: "Expired - the payment window closed and the unit went back on sale",
  cancelled: "Cancelled - the unit went back on sale",
  refunded: "Refunded - your payment came after the order ended, and was given back",
  payment_failed:
    "Payment failed - your card's authorisation ended before the payment was taken; you were not charged, and the unit went back on sale",
};

function renderOrder(now) {
  const order = state.order;
  ui.order.hidden = false;
  ui.orderStatus.textContent = ORDER_TEXT[order.status] || order.status;
  ui.orderStatus.dataset.status = order.status;
  ui.orderId.textContent = order.order_id;
  // The order's own price, the one it was reserved at.
  ui.orderPrice.hidden = !order.price;
  ui.orderPrice.textContent = order.price
    ? `${order.status === "paid" ? "Paid" : "Price"}: ${formatPrice(order.price)}`
    : "";
  const open = order.status === "reserved";
  const left = Date.parse(order.expires_at) - now;
  ui.payCountdown.hidden = !open;
  ui.payCountdown.textContent =
    // Rounded down: the deadline is already the window rounded up to a whole second
    // (the release timer's precision), and rounding up again showed 1:01 for a minute.
    left > 0 ? `Pay within ${formatDuration(left, Math.floor)}` : "The payment window has closed; releasing the unit...";
  const busy = ui.pay.dataset.busy === "1";
  // A deployment without card payments holds the order until its deadline: no Pay.
  ui.pay.hidden = !open || !!state.card || !state.takesCards;
  ui.noPayments.hidden = !open || state.takesCards;
  ui.cancel.hidden = !open;
  ui.pay.disabled = ui.cancel.disabled = !open || left <= 0 || busy;
  ui.cardForm.hidden = !open || !state.card;
  ui.payCard.disabled = !open || left <= 0 || busy;
  if (state.card && order.price) ui.payCard.textContent = `Pay ${formatPrice(order.price)}`;
  if (!open && state.card) closeCard();
}

function sayOnCard(text) {
  ui.cardMessage.textContent = text || "";
  ui.cardMessage.hidden = !text;
}

function closeCard() {
  state.card?.close();
  state.card = null;
  sayOnCard("");
}

/** The Pay button, where the deployment takes cards: the order's payment and the card form. */
async function openCard() {
  const order = state.order;
  if (!order || state.card) return;
  ui.pay.dataset.busy = "1";
  render();
  let form;
  try {
    form = await openCardForm(order.order_id, state.session.token, ui.cardField);
  } catch (error) {
    form = { error: { ok: false, status: 0, data: { message: error.message } } };
  } finally {
    delete ui.pay.dataset.busy;
  }
  if (form.error) {
    say(humanMessage(form.error), "error");
    following = null;
    followOrder(order.order_id);
  } else if (state.order?.order_id === order.order_id) {
    state.card = form;
  } else {
    form.close();
  }
  render();
}

/** The card form's button: Stripe confirms the card, then the API settles the order. */
async function payByCard() {
  const order = state.order;
  const form = state.card;
  if (!order || !form) return;
  ui.pay.dataset.busy = "1";
  sayOnCard("");
  render();
  let outcome;
  try {
    outcome = await form.pay();
  } catch (error) {
    // Stripe.js itself failed (a network error): nothing settled, the buyer may try again.
    outcome = { cardError: error.message || "The payment could not be sent. Try again.", settled: null };
  } finally {
    delete ui.pay.dataset.busy;
  }
  const { cardError, settled } = outcome;
  if (!settled) {
    sayOnCard(cardError);
    render();
    return;
  }
  if (!settled.ok) {
    say(humanMessage(settled), "error");
  } else {
    updateOrder(settled.data);
    if (settled.data.settlement === "voided") {
      say("The payment window closed before your payment went through; no money was taken.", "error");
    } else if (cardError && settled.data.status === "reserved") {
      sayOnCard(cardError);
    }
  }
  render();
}

async function cancel() {
  const order = state.order;
  if (!order) return;
  ui.pay.dataset.busy = "1";
  render();
  // Cancelling is idempotent: a busy answer is simply asked again.
  const result = await untilAnswered(() =>
    call(`/orders/${encodeURIComponent(order.order_id)}/cancel`, {
      method: "POST",
      token: state.session.token,
    }),
  );
  delete ui.pay.dataset.busy;
  if (result.ok) {
    updateOrder(result.data);
    if (FINAL.has(result.data.status)) following = null;
  } else {
    say(humanMessage(result), "error");
    // order_expired / order_cancelled / order_paid: the order's real state says more.
    following = null;
    followOrder(order.order_id);
  }
  render();
}

// ---------------------------------------------------------------- the buyer's orders

const MY_ORDER_TEXT = {
  reserved: "Awaiting payment",
  paid: "Paid",
  expired: "Expired",
  cancelled: "Cancelled",
  refunded: "Refunded",
  payment_failed: "Payment failed",
};

/** The buyer's list as read so far: its pages, where the next starts, the latest read. */
const myOrders = { orders: [], next: null, reads: 0, loaded: false };

/**
 * The buyer's own orders in every sale (`GET /orders`: sale by sale, the latest first),
 * read when the buyer opens "Your orders" or a grab finds them at their limit, never on
 * load: a crowd loading the page costs no call for it. `more`: the next page, added.
 * The orders so far, or `null` when this answer is not shown (it failed, the buyer
 * signed out or in as someone else meanwhile, or a later read was sent).
 */
async function loadMyOrders({ more = false } = {}) {
  const session = state.session;
  if (!session) return null;
  const read = ++myOrders.reads;
  const cursor = more && myOrders.next ? `&cursor=${encodeURIComponent(myOrders.next)}` : "";
  const result = await call(`/orders?limit=10${cursor}`, { token: session.token });
  if (state.session !== session || read !== myOrders.reads || !result.ok) return null;
  myOrders.orders = more ? [...myOrders.orders, ...result.data.orders] : result.data.orders;
  myOrders.next = result.data.next_cursor ?? null;
  myOrders.loaded = true;
  drawMyOrders();
  return myOrders.orders;
}

/** Reads the list again if the buyer has it open: an order began or ended here. */
function refreshMyOrders() {
  if (ui.myOrdersDetails.open) loadMyOrders();
}

function drawMyOrders() {
  // This page's own order as its poll last read it: the list's index may lag a write.
  const shown = myOrders.orders.map((order) =>
    order.order_id === state.order?.order_id ? { ...order, ...state.order } : order,
  );
  ui.myOrdersList.replaceChildren(...shown.map(myOrderRow));
  ui.myOrdersEmpty.hidden = shown.length > 0 || !myOrders.loaded;
  ui.myOrdersMore.hidden = !myOrders.next;
}

/**
 * A grab refused as `limit_reached`: the buyer holds a unit of this sale already, from
 * another tab or device perhaps. Found among their orders, it is followed here, its
 * payment deadline shown, and it can be paid here.
 */
async function findHeldOrder() {
  const session = state.session;
  const heldHere = (orders) => orders?.find((order) => order.sale_id === saleId && order.status === "reserved");
  let orders = await loadMyOrders();
  for (let page = 1; orders && !heldHere(orders) && myOrders.next && page < 5; page++) {
    orders = await loadMyOrders({ more: true });
  }
  const held = heldHere(orders);
  if (held && state.session === session && state.phase === "idle") followHere(held);
}

function myOrderRow(order) {
  const row = document.createElement("li");
  row.dataset.orderId = order.order_id;
  row.dataset.status = order.status;
  const sale = document.createElement("a");
  sale.href = `?sale=${encodeURIComponent(order.sale_id)}`;
  sale.textContent = order.sale_id;
  const status = document.createElement("span");
  status.className = "my-order-status";
  status.textContent = MY_ORDER_TEXT[order.status] || order.status;
  row.append(sale, status);
  if (order.price) row.append(formatPrice(order.price));
  if (order.status === "reserved") {
    const due = document.createElement("time");
    due.dateTime = order.expires_at;
    due.textContent = `pay by ${new Date(order.expires_at).toLocaleTimeString()}`;
    row.append(due);
  }
  return row;
}

// ---------------------------------------------------------------- start

async function signedInChanged() {
  closeCard();
  state.session = await currentSession();
  following = null;
  state.order = null;
  state.phase = "idle";
  state.atLimit = false;
  ui.order.hidden = true;
  // Another buyer's list is never left on screen.
  myOrders.orders = [];
  myOrders.next = null;
  myOrders.loaded = false;
  myOrders.reads += 1;
  drawMyOrders();
  ui.myOrders.hidden = !state.session;
  const stored = state.session && saleId && sessionStorage.getItem(orderKey());
  // Its status and deadline come with the first read.
  if (stored) followHere({ order_id: stored, status: "reserved", expires_at: new Date(8.64e15).toISOString() });
  refreshMyOrders();
  render();
}

async function main() {
  const signInError = await completeProviderSignIn();
  saleId = new URLSearchParams(location.search).get("sale");
  await renderSignIn($("#signin"), { onChange: signedInChanged });
  if (signInError) say(signInError, "error");
  ui.myOrdersDetails.addEventListener("toggle", refreshMyOrders);
  ui.myOrdersMore.addEventListener("click", () => loadMyOrders({ more: true }));
  if (!saleId) {
    // The front page: the buyer's orders, open, under the sale picker.
    $("#picker").hidden = false;
    $("#sale").hidden = true;
    ui.myOrdersDetails.open = true;
    await signedInChanged();
    return;
  }
  ui.buy.addEventListener("click", buy);
  state.takesCards = await takesCards();
  ui.pay.addEventListener("click", openCard);
  ui.payCard.addEventListener("click", payByCard);
  ui.cancel.addEventListener("click", cancel);
  await signedInChanged();
  pollStatus();
  setInterval(render, 200);
}

main();
