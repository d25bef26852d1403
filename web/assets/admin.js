// The admin console: create a sale, list the sales, watch one's stock by state live
// (with a small inline SVG chart and the reconciliation flag), block and unblock users.

import { $, call, formatPrice, humanMessage, sleep, untilAnswered } from "./api.js";
import { completeProviderSignIn, currentSession, renderSignIn } from "./auth.js";
import { CURRENCY_DECIMALS } from "./currencies.js";

const SERIES = ["available", "reserved", "paid"];
const MAX_POINTS = 150;
const STATS_EVERY_MS = 2000;

let session = null;
let watching = null;

function say(text, kind = "info") {
  const p = $("#admin-message");
  p.textContent = text || "";
  p.dataset.kind = kind;
  p.hidden = !text;
}

function requireAdmin() {
  if (!session) say("Sign in as an admin to use the console.", "error");
  else if (!session.admin) say("You are signed in, but not as an admin: the API will refuse these calls.", "error");
  else say("");
}

// ---------------------------------------------------------------- create

/**
 * The form's price as the API takes it: `{amount, currency}`, the amount in the
 * currency's ISO 4217 minor unit, or `{error}`. Whether Stripe charges that amount (its
 * minimum, its steps) is the API's to say, naming the price.
 */
function priceOf(form) {
  const currency = form.elements.currency.value.trim().toUpperCase();
  const decimals = Object.hasOwn(CURRENCY_DECIMALS, currency) ? CURRENCY_DECIMALS[currency] : undefined;
  if (decimals === undefined) {
    return { error: "The currency must be a three-letter ISO 4217 code that Stripe charges in, such as EUR." };
  }
  const major = Number(form.elements.price.value);
  const minor = major * 10 ** decimals;
  const amount = Math.round(minor);
  if (!form.elements.price.value.trim() || !Number.isFinite(minor) || amount < 1) {
    return { error: "The price must be a positive amount." };
  }
  if (Math.abs(minor - amount) > 1e-6) {
    return { error: `${currency} takes at most ${decimals} decimal${decimals === 1 ? "" : "s"}.` };
  }
  return { amount, currency };
}

function previewPrice(form) {
  const price = priceOf(form);
  $("#price-preview").textContent = price.error || `${price.amount} ${price.currency} minor units`;
}

async function createSale(event) {
  event.preventDefault();
  const form = event.target;
  const value = (name) => form.elements[name].value.trim();
  const price = priceOf(form);
  if (price.error) return say(price.error, "error");
  const startsAt = new Date(Date.now() + Number(value("starts_in")) * 1000);
  const endsAt = new Date(startsAt.getTime() + Number(value("open_for")) * 60_000);
  const body = {
    name: value("name"),
    price,
    stock: Number(value("stock")),
    starts_at: startsAt.toISOString().replace(/\.\d+Z$/, "Z"),
    ends_at: endsAt.toISOString().replace(/\.\d+Z$/, "Z"),
    per_user_limit: Number(value("per_user_limit") || 1),
    payment_timeout_secs: Number(value("payment_timeout_secs") || 900),
    challenge_work: Number(value("challenge_work") || 0),
    reserve: value("reserve") || "adaptive",
  };
  // The id is chosen here, so that asking again after a busy answer cannot create a
  // second sale: a retry that finds it already there found the one just created.
  body.sale_id = value("sale_id") || `sale-${crypto.getRandomValues(new Uint32Array(2)).join("")}`;
  let retried = false;
  const result = await untilAnswered(() => call("/admin/sales", { method: "POST", token: session?.token, body }), {
    onWait: () => (retried = true),
  });
  const createdByUs = retried && result.data?.error === "sale_exists";
  if (!result.ok && !createdByUs) return say(humanMessage(result), "error");
  const sale = result.ok ? result.data : body;
  // The price as the API stored it, in its own decimals.
  say(result.ok ? `Created sale ${sale.sale_id} at ${formatPrice(sale.price)}.` : `Created sale ${sale.sale_id}.`);
  const created = $("#created");
  const link = new URL(`./?sale=${encodeURIComponent(sale.sale_id)}`, location.href);
  created.innerHTML = "";
  created.append("Buyers' page: ");
  const a = document.createElement("a");
  a.href = link.toString();
  a.textContent = link.toString();
  a.dataset.testid = "buyer-link";
  created.append(a);
  created.hidden = false;
  $("#watch").elements.sale_id.value = sale.sale_id;
  watch(sale.sale_id);
  loadSales();
}

// ---------------------------------------------------------------- stats

async function watch(saleId) {
  const token = Symbol(saleId);
  watching = token;
  const points = [];
  $("#stats").hidden = false;
  $("#stats-sale").textContent = saleId;
  showSaleHead(saleId, token);
  loadAudit(saleId, token);
  while (watching === token) {
    const result = await call(`/admin/sales/${encodeURIComponent(saleId)}/stats`, { token: session?.token });
    if (watching !== token) return;
    if (result.ok) {
      points.push({ at: Date.now(), ...result.data });
      if (points.length > MAX_POINTS) points.shift();
      showStats(result.data);
      drawChart(points);
    } else {
      say(humanMessage(result), "error");
      if (result.status === 401 || result.status === 403 || result.status === 404) return;
    }
    await sleep(STATS_EVERY_MS);
  }
}

/** The watched sale's price and whether it sells, from its public page. */
async function showSaleHead(saleId, token) {
  const tag = $("#stats-price");
  tag.textContent = "";
  showControl(null);
  const result = await untilAnswered(() => call(`/sales/${encodeURIComponent(saleId)}`));
  if (watching !== token || !result.ok) return;
  tag.textContent = formatPrice(result.data.price);
  const control = { paused: "paused", ended: "ended" }[result.data.status] || "open";
  showControl(control);
}

// ---------------------------------------------------------------- pause, resume, end

const CONTROL_TEXT = { open: "open", paused: "paused", ended: "ended" };
const ACTION_DONE = { pause: "paused", resume: "resumed", end: "ended" };

/** The watched sale's control, and the buttons that can change it (none while unknown). */
function showControl(control) {
  $("#control-state").textContent = control ? CONTROL_TEXT[control] : "...";
  $("#control-state").dataset.control = control || "";
  $("#pause").disabled = control !== "open";
  $("#resume").disabled = control !== "paused";
  $("#end").disabled = control !== "open" && control !== "paused";
}

async function controlSale(action) {
  const saleId = $("#stats-sale").textContent;
  const token = watching;
  if (!saleId) return;
  if (action === "end" && !confirm(`End ${saleId} now? Nothing reopens an ended sale.`)) return;
  showControl(null);
  // A repeat changes nothing, so a busy answer is simply asked again.
  const result = await untilAnswered(() =>
    call(`/admin/sales/${encodeURIComponent(saleId)}/${action}`, { method: "POST", token: session?.token }),
  );
  // The operator may have turned to another sale meanwhile: this answer is not its.
  if (watching !== token) return;
  if (!result.ok) {
    say(humanMessage(result), "error");
    return showSaleHead(saleId, token);
  }
  showControl(result.data.control);
  say(result.data.changed ? `${saleId} ${ACTION_DONE[action]}.` : `${saleId} was ${result.data.control} already.`);
  await Promise.all([loadAudit(saleId, token), loadSales()]);
}

/** Every page of the watched sale's paid orders, joined into one CSV file and saved. */
async function downloadPaidOrders() {
  const saleId = $("#stats-sale").textContent;
  if (!saleId) return;
  const button = $("#download-orders");
  button.disabled = true;
  const parts = [];
  let cursor = null;
  let rows = 0;
  try {
    do {
      const query = new URLSearchParams({ status: "paid", limit: "1000" });
      if (cursor) query.set("cursor", cursor);
      // A read: a busy answer is simply asked again.
      const result = await untilAnswered(() =>
        call(`/admin/sales/${encodeURIComponent(saleId)}/orders.csv?${query}`, { token: session?.token }),
      );
      if (!result.ok) return say(humanMessage(result), "error");
      parts.push(result.text);
      rows += result.text.split("\n").filter((line) => line).length - (cursor ? 0 : 1);
      const next = result.headers.get("x-next-cursor");
      // A cursor that does not move would ask for the same page for ever.
      if (next && next === cursor) return say("The export did not move on. Try again.", "error");
      cursor = next;
      if (cursor) say(`Exporting the paid orders of ${saleId}: ${rows} so far...`);
    } while (cursor);
  } finally {
    button.disabled = false;
  }
  const link = document.createElement("a");
  link.href = URL.createObjectURL(new Blob(parts, { type: "text/csv" }));
  link.download = `${saleId}-paid-orders.csv`;
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 60_000);
  say(`Downloaded ${rows} paid ${rows === 1 ? "order" : "orders"} of ${saleId}.`);
}

/** Who paused, resumed or ended the watched sale, and when, newest first. */
async function loadAudit(saleId, token) {
  const list = $("#audit");
  const result = await untilAnswered(() =>
    call(`/admin/sales/${encodeURIComponent(saleId)}/audit`, { token: session?.token }),
  );
  if (watching !== token) return;
  list.replaceChildren();
  if (!result.ok) return say(humanMessage(result), "error");
  fillList(list, result.data.entries, "Never paused or ended.", (entry, li) => {
    li.dataset.action = entry.action;
    const when = document.createElement("time");
    when.dateTime = entry.at;
    when.textContent = new Date(entry.at).toLocaleString();
    li.append(when, ` ${ACTION_DONE[entry.action]} by ${entry.by}`);
  });
}

/** One `li` per item, drawn by `draw(item, li)`; a muted `emptyText` line for none. */
function fillList(list, items, emptyText, draw) {
  if (!items.length) {
    const li = document.createElement("li");
    li.className = "muted";
    li.textContent = emptyText;
    list.append(li);
  }
  for (const item of items) {
    const li = document.createElement("li");
    draw(item, li);
    list.append(li);
  }
}

function showStats(stats) {
  for (const cell of document.querySelectorAll("[data-count]")) {
    cell.textContent = String(stats[cell.dataset.count] ?? "-");
  }
  const badge = $("#consistent");
  badge.textContent = stats.consistent ? "consistent" : "NOT consistent";
  badge.dataset.status = stats.consistent ? "active" : "sold_out";
}

/** Stock by state over time: one polyline per state, on a shared scale. */
function drawChart(points) {
  const svg = $("#chart");
  const [width, height, pad] = [600, 180, 6];
  const top = Math.max(1, ...points.map((p) => p.stock_total));
  const t0 = points[0].at;
  const span = Math.max(1, points[points.length - 1].at - t0);
  const x = (p) => pad + ((p.at - t0) / span) * (width - 2 * pad);
  const y = (v) => height - pad - (v / top) * (height - 2 * pad);
  const ns = "http://www.w3.org/2000/svg";
  svg.replaceChildren();
  for (const series of SERIES) {
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("class", `line ${series}`);
    // Steps, not slopes: a count holds its value until the next reading.
    const coords = points.flatMap((p, i) => {
      const here = `${x(p).toFixed(1)},${y(p[series]).toFixed(1)}`;
      return i === 0 ? [here] : [`${x(p).toFixed(1)},${y(points[i - 1][series]).toFixed(1)}`, here];
    });
    line.setAttribute("points", coords.join(" "));
    svg.append(line);
  }
  svg.dataset.points = String(points.length);
}

// ---------------------------------------------------------------- sales

const SALES_PER_PAGE = 20;
const SALE_STATUS = { upcoming: "Upcoming", active: "Live", paused: "Paused", sold_out: "Sold out", ended: "Ended" };
let salesCursor = null;
let salesAsked = 0;

/** The first page of sales again, or with `more` the next one after those shown. */
async function loadSales(more = false) {
  const body = $("#sales");
  const query = new URLSearchParams({ limit: String(SALES_PER_PAGE) });
  if (more && salesCursor) query.set("cursor", salesCursor);
  // Only the latest request draws: an older answer arriving last would undo a newer one.
  const asked = ++salesAsked;
  const result = await untilAnswered(() => call(`/admin/sales?${query}`, { token: session?.token }));
  if (asked !== salesAsked) return;
  if (!result.ok) return say(humanMessage(result), "error");
  if (!more) body.replaceChildren();
  for (const sale of result.data.sales) body.append(saleRow(sale));
  if (!body.children.length) {
    const row = body.insertRow();
    const cell = row.insertCell();
    cell.colSpan = 5;
    cell.className = "muted";
    cell.textContent = "No sales yet.";
  }
  salesCursor = result.data.next_cursor || null;
  $("#sales-more").hidden = !salesCursor;
}

function saleRow(sale) {
  const row = document.createElement("tr");
  row.dataset.sale = sale.sale_id;
  const name = row.insertCell();
  const page = document.createElement("a");
  page.href = new URL(`./?sale=${encodeURIComponent(sale.sale_id)}`, location.href).toString();
  page.textContent = sale.name;
  const id = document.createElement("small");
  id.className = "muted";
  id.textContent = ` ${sale.sale_id}`;
  name.append(page, id);
  const status = row.insertCell();
  status.textContent = SALE_STATUS[sale.status] || sale.status;
  status.dataset.status = sale.status;
  row.insertCell().textContent = `${sale.stock_available} of ${sale.stock_total}`;
  row.insertCell().textContent = new Date(sale.ends_at).toLocaleString();
  const actions = row.insertCell();
  const stats = document.createElement("button");
  stats.type = "button";
  stats.className = "secondary";
  stats.textContent = "Watch";
  stats.setAttribute("aria-label", `Watch ${sale.name} (${sale.sale_id})`);
  stats.addEventListener("click", () => {
    $("#watch").elements.sale_id.value = sale.sale_id;
    watch(sale.sale_id);
  });
  actions.append(stats);
  return row;
}

// ---------------------------------------------------------------- blocklist

async function loadBlocklist() {
  const list = $("#blocked");
  const result = await untilAnswered(() => call("/admin/blocklist", { token: session?.token }));
  list.replaceChildren();
  if (!result.ok) return say(humanMessage(result), "error");
  fillList(list, result.data.users, "Nobody is blocked.", (user, li) => {
    li.dataset.user = user;
    const name = document.createElement("span");
    name.textContent = user;
    const unblock = document.createElement("button");
    unblock.type = "button";
    unblock.className = "secondary";
    unblock.textContent = "Unblock";
    unblock.addEventListener("click", () => setBlocked(user, false));
    li.append(name, unblock);
  });
}

async function setBlocked(userId, blocked) {
  // Both are idempotent: a busy answer is simply asked again.
  const result = await untilAnswered(() =>
    call(`/admin/blocklist/${encodeURIComponent(userId)}`, {
      method: blocked ? "PUT" : "DELETE",
      token: session?.token,
    }),
  );
  if (!result.ok) return say(humanMessage(result), "error");
  say(blocked ? `Blocked ${userId}.` : `Unblocked ${userId}.`);
  await loadBlocklist();
}

// ---------------------------------------------------------------- start

async function signedInChanged() {
  session = await currentSession();
  watching = null;
  requireAdmin();
  if (session?.admin) await Promise.all([loadSales(), loadBlocklist()]);
}

async function main() {
  const signInError = await completeProviderSignIn();
  await renderSignIn($("#signin"), { onChange: signedInChanged, adminDefault: true });
  $("#create").addEventListener("submit", createSale);
  $("#create").addEventListener("input", (event) => previewPrice(event.currentTarget));
  previewPrice($("#create"));
  $("#watch").addEventListener("submit", (event) => {
    event.preventDefault();
    watch(event.target.elements.sale_id.value.trim());
  });
  $("#sales-refresh").addEventListener("click", () => loadSales());
  $("#sales-more").addEventListener("click", () => loadSales(true));
  for (const action of ["pause", "resume", "end"]) {
    $(`#${action}`).addEventListener("click", () => controlSale(action));
  }
  $("#download-orders").addEventListener("click", downloadPaidOrders);
  $("#block").addEventListener("submit", (event) => {
    event.preventDefault();
    setBlocked(event.target.elements.user_id.value.trim(), true);
  });
  await signedInChanged();
  if (signInError) say(signInError, "error");
}

main();
