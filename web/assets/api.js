// The HTTP API as the pages see it: one fetch wrapper that never throws on a status,
// the human message of every error the API or the gateway can answer, and the retry
// delays. The pages are served from the API's own origin (CloudFront deployed, the
// local gateway in `make run`), so every path is relative and no CORS is involved.

/**
 * What one call answered: `status` 0 means no answer at all (network failure). `data` is
 * the JSON body; `text` the body as it came, for the one route that answers CSV.
 */
export async function call(path, { method = "GET", token, body, headers = {}, signal } = {}) {
  const init = { method, headers: { ...headers }, signal, cache: "no-store" };
  if (token) init.headers.authorization = `Bearer ${token}`;
  if (body !== undefined) {
    init.headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    return { ok: false, status: 0, data: null, headers: new Headers(), networkError: String(error) };
  }
  let data = null;
  let fromEdge = false;
  const text = await response.text().catch(() => "");
  const csv = (response.headers.get("content-type") || "").startsWith("text/csv");
  if (text && !csv) {
    try {
      data = JSON.parse(text);
    } catch {
      // Neither the API nor API Gateway: CloudFront or its WAF answered (HTML).
      fromEdge = true;
      data = { message: text.slice(0, 200) };
    }
  }
  return { ok: response.ok, status: response.status, data, text, headers: response.headers, fromEdge };
}

// Every error code of openapi.yaml, as a buyer or an operator should read it.
const MESSAGES = {
  invalid_json: "The request could not be read. Reload the page and try again.",
  invalid_input: "Some of what was entered is not valid.",
  unauthorized: "Please sign in again: your sign-in is missing or has expired.",
  forbidden: "Your account is not allowed to do that.",
  not_found: "That does not exist.",
  payload_too_large: "That request is too large.",
  sale_not_found: "There is no such sale. Check the link.",
  sale_exists: "A sale with this id already exists. Pick another id.",
  not_started: "The sale has not started yet. Hold on, the button opens at the start.",
  ended: "The sale has ended.",
  sale_paused: "The shop has paused this sale. Hold on: the button comes back when it resumes.",
  sold_out: "Sold out. Every unit is taken; if one is released, the button comes back.",
  limit_reached: "You already hold or bought as many as one buyer may in this sale.",
  invalid_token: "This purchase link is not valid for you any more. Try again.",
  challenge_required: "This sale asks your browser to solve a small puzzle first. Reload the page and try again.",
  challenge_failed: "The puzzle's answer was not accepted (it may have expired). Try again.",
  no_challenge: "This sale asks for no puzzle. Reload the page and try again.",
  blocked: "Your account is blocked from this sale. Contact support if this is a mistake.",
  order_not_found: "That order does not exist (or is not yours).",
  order_expired: "The payment window closed; the unit went back on sale.",
  order_cancelled: "This order was cancelled.",
  order_paid: "This order is already paid.",
  payments_off: "This shop takes no payments yet: your order is held until its deadline.",
  payment_unavailable: "The card payment service did not answer. Nothing was charged; try again.",
  no_payment: "Open the card form and pay first.",
  payment_mismatch: "This payment does not match the order. Contact support.",
  not_payable: "This order has no price and cannot be paid.",
  unavailable: "The service is busy right now. Retrying shortly.",
  // The edge's limits per buyer and per network (WAF), which say how long to wait.
  rate_limited: "Too many tries from you or your network just now. Waiting, then trying again.",
  internal: "Something went wrong on our side. Please try again.",
};

// API Gateway's own answers carry only `{"message": ...}` and cannot be customised.
const GATEWAY_MESSAGES = {
  401: "Please sign in again: your sign-in is missing or has expired.",
  403: "Your account is not allowed to do that.",
  404: "That address does not exist.",
  413: "That request is too large.",
  429: "Too many buyers at once. Retrying shortly.",
  500: "Something went wrong on our side. Please try again.",
  502: "Something went wrong on our side. Please try again.",
  503: "The service is busy right now. Retrying shortly.",
  504: "The service took too long to answer. Please try again.",
};

/** The message to show for a failed call. */
export function humanMessage(result) {
  if (result.status === 0) return "No connection to the shop. Check your network; retrying.";
  // Neither the API nor API Gateway: CloudFront itself refused (its HTML error page).
  if (result.fromEdge && result.status >= 400 && result.status < 500) {
    return "The shop's network edge refused this request. Wait a minute, then try again.";
  }
  const code = result.data && result.data.error;
  if (code && MESSAGES[code]) {
    // invalid_input's own text says which field; the operator needs it.
    return code === "invalid_input" && result.data.message
      ? `${MESSAGES.invalid_input} (${result.data.message})`
      : MESSAGES[code];
  }
  return GATEWAY_MESSAGES[result.status] || `Unexpected answer (${result.status}). Please try again.`;
}

/** Whether trying the same request again can help: throttled, busy, or no answer. */
export function isRetryable(result) {
  return result.status === 0 || result.status === 429 || result.status === 503;
}

/**
 * How long to wait before retry number `attempt` (1, 2, ...): at least what Retry-After
 * asks, plus full jitter over an exponential window, so a crowd throttled at the same
 * instant does not come back at the same instant.
 */
export function retryDelayMs(attempt, result, { baseMs = 250, capMs = 4000 } = {}) {
  const window = Math.min(capMs, baseMs * 2 ** Math.min(attempt - 1, 10));
  const jitter = Math.random() * window;
  const retryAfter = Number.parseFloat(result.headers?.get("retry-after") ?? "");
  const floor = Number.isFinite(retryAfter) && retryAfter >= 0 ? retryAfter * 1000 : 0;
  return floor + jitter;
}

/**
 * Runs `request(attempt)` (attempt 0, 1, ...) until its answer is not `retryable`,
 * `attempts` run out or `stop()` says so, waiting `retryDelayMs` between tries.
 * Returns the last answer. Only for requests that are safe to repeat.
 */
export async function untilAnswered(
  request,
  { attempts = 8, retryable = isRetryable, stop = () => false, onResult, onWait } = {},
) {
  for (let attempt = 0; ; attempt += 1) {
    const result = await request(attempt);
    onResult?.(result);
    if (!retryable(result, attempt) || attempt + 1 >= attempts || stop()) return result;
    onWait?.(result, attempt);
    await sleep(retryDelayMs(attempt + 1, result));
    if (stop()) return result;
  }
}

export function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

/**
 * `12:03` or `1:02:03` for a duration, `0:00` once past. Rounded up by default, for a
 * countdown to a start (it reads 0:00 only once the start has come); `Math.floor` for
 * time left to act in, which must never read more than there is.
 */
export function formatDuration(ms, round = Math.ceil) {
  const total = Math.max(0, round(ms / 1000));
  const hours = Math.floor(total / 3600);
  const minutes = Math.floor((total % 3600) / 60);
  const seconds = String(total % 60).padStart(2, "0");
  if (total >= 86400) return `${Math.floor(total / 86400)}d ${hours % 24}h`;
  return hours ? `${hours}:${String(minutes).padStart(2, "0")}:${seconds}` : `${minutes}:${seconds}`;
}

/**
 * A price from the API (`{amount, currency, decimals}`, the amount in the currency's
 * minor unit) as the reader's locale writes it: "€1,299.00", "¥1,299". The decimals
 * are the API's (ISO 4217's), not the locale data's, which differ for a few currencies.
 */
export function formatPrice(price) {
  if (!price) return "";
  const digits = price.decimals;
  return new Intl.NumberFormat(undefined, {
    style: "currency",
    currency: price.currency,
    minimumFractionDigits: digits,
    maximumFractionDigits: digits,
  }).format(price.amount / 10 ** digits);
}

export function $(selector) {
  return document.querySelector(selector);
}
