// Paying an order by card through Stripe. The API opens (or answers again) the order's
// PaymentIntent; Stripe.js, loaded from where config.json says (Stripe deployed, the
// local Stripe's fake under `make run`), takes the card in its Element and confirms the
// payment with the publishable key and the client secret; then the API settles the order
// from the payment as Stripe has it. The page's word decides nothing: a closed tab is
// settled by Stripe's webhook all the same.

import { call, untilAnswered } from "./api.js";
import { loadConfig } from "./auth.js";

let stripeJs = null;

/** Stripe.js from `url`, loaded once (a classic script: it finds its origin from its own src). */
function loadStripeJs(url) {
  stripeJs ??= new Promise((resolve, reject) => {
    const script = document.createElement("script");
    script.src = url;
    script.onload = () => resolve(window.Stripe);
    script.onerror = () => {
      stripeJs = null;
      reject(new Error("The card form could not be loaded. Check your connection and try again."));
    };
    document.head.append(script);
  });
  return stripeJs;
}

/** Whether this deployment takes card payments: its config.json names Stripe.js. */
export async function takesCards() {
  return Boolean((await loadConfig()).stripe_js);
}

function orderPath(orderId, rest) {
  return `/orders/${encodeURIComponent(orderId)}/${rest}`;
}

/**
 * Opens the order's payment and mounts Stripe's card Element in `container`.
 * Answers `{ error }` (the API's answer, or a load failure) or a form whose `pay()`
 * confirms the card and settles the order: `{ cardError, settled }`, where `cardError`
 * is Stripe's message for a card it refused (declined, authentication failed) and
 * `settled` the API's answer to the settlement.
 */
export async function openCardForm(orderId, token, container) {
  const opened = await untilAnswered(() => call(orderPath(orderId, "payment"), { method: "POST", token }));
  if (!opened.ok) return { error: opened };
  let Stripe;
  try {
    Stripe = await loadStripeJs((await loadConfig()).stripe_js);
  } catch (error) {
    return { error: { ok: false, status: 0, data: { message: error.message } } };
  }
  const stripe = Stripe(opened.data.publishable_key);
  const card = stripe.elements().create("card");
  container.replaceChildren();
  card.mount(container);
  return {
    payment: opened.data,
    async pay() {
      const { error } = await stripe.confirmCardPayment(opened.data.client_secret, {
        payment_method: { card },
      });
      // Asked whatever Stripe.js said: the settlement reads the payment from Stripe, and
      // a refused card leaves the order awaiting payment.
      const settled = await untilAnswered(() => call(orderPath(orderId, "payment/confirm"), { method: "POST", token }));
      return { cardError: error?.message || null, settled };
    },
    close() {
      card.unmount?.();
      container.replaceChildren();
    },
  };
}
