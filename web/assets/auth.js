// Signing in. `config.json`, served next to the pages, says how:
//   {"auth": "local"}  the local stack (`make run`): "sign in as" any user through
//                      its local-only POST /local/token;
//   {"auth": "oidc", "client_id", "authorize_url", "token_url", "logout_url"?, "scope"?,
//    "admin_claim"?, "admin_group"?}
//                      the JWT authorizer's identity provider (the Cognito hosted UI in
//                      docs/deploy.md): authorization code with PKCE, a public client
//                      with no secret; the ID token is the bearer token the API checks.
// The token lives in sessionStorage: per tab, so two windows can be two users.

import { call, humanMessage } from "./api.js";

const TOKEN_KEY = "flashsale.token";
const PKCE_KEY = "flashsale.pkce";

let configPromise;

export function loadConfig() {
  configPromise ??= fetch("config.json", { cache: "no-store" })
    .then((r) => (r.ok ? r.json() : { auth: "local" }))
    .catch(() => ({ auth: "local" }));
  return configPromise;
}

function base64url(bytes) {
  let text = "";
  for (const b of new Uint8Array(bytes)) text += String.fromCharCode(b);
  return btoa(text).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function randomString(byteCount = 32) {
  return base64url(crypto.getRandomValues(new Uint8Array(byteCount)));
}

/** The claims of a JWT, unverified: only to show who is signed in (the API verifies). */
export function claimsOf(token) {
  try {
    const payload = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    const json = decodeURIComponent(
      Array.from(atob(payload), (c) => `%${c.charCodeAt(0).toString(16).padStart(2, "0")}`).join(""),
    );
    return JSON.parse(json);
  } catch {
    return null;
  }
}

/** The signed-in session: `{token, user, admin}`, or null (none, or expired). */
export async function currentSession() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const claims = token && claimsOf(token);
  // exp is in the token's own (server) time; a minute of slack for a slow local clock.
  if (!claims || (claims.exp && claims.exp * 1000 < Date.now() - 60_000)) {
    sessionStorage.removeItem(TOKEN_KEY);
    return null;
  }
  const config = await loadConfig();
  const claimName = config.admin_claim || "cognito:groups";
  const group = config.admin_group || "admin";
  const groups = claims[claimName];
  const admin = Array.isArray(groups)
    ? groups.includes(group)
    : typeof groups === "string" && groups.replace(/[[\]]/g, "").split(/[\s,]+/).includes(group);
  return { token, user: claims["cognito:username"] || claims.username || claims.sub, admin };
}

export function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
}

/** Local stack only: a token for any user. Returns an error message or null. */
export async function signInLocally(userId, admin) {
  const result = await call("/local/token", { method: "POST", body: { user_id: userId, admin } });
  if (!result.ok || !result.data?.token) return humanMessage(result);
  sessionStorage.setItem(TOKEN_KEY, result.data.token);
  return null;
}

/** OIDC: off to the provider's sign-in page with a fresh PKCE verifier. */
export async function signInWithProvider() {
  const config = await loadConfig();
  const verifier = randomString(48);
  const challenge = base64url(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier)));
  const state = randomString(16);
  const returnTo = location.pathname + location.search;
  sessionStorage.setItem(PKCE_KEY, JSON.stringify({ verifier, state, returnTo }));
  const url = new URL(config.authorize_url);
  url.search = new URLSearchParams({
    response_type: "code",
    client_id: config.client_id,
    redirect_uri: redirectUri(),
    scope: config.scope || "openid email profile",
    state,
    code_challenge: challenge,
    code_challenge_method: "S256",
  }).toString();
  location.assign(url.toString());
}

// Both pages are valid redirect targets; the page the buyer was on is restored after.
function redirectUri() {
  return location.origin + location.pathname;
}

/**
 * Back from the provider (`?code=...&state=...`): trades the code and the verifier for
 * tokens. Returns an error message, or null (signed in, or nothing to complete).
 */
export async function completeProviderSignIn() {
  const params = new URLSearchParams(location.search);
  const code = params.get("code");
  const error = params.get("error");
  if (!code && !error) return null;
  const pending = JSON.parse(sessionStorage.getItem(PKCE_KEY) || "null");
  sessionStorage.removeItem(PKCE_KEY);
  history.replaceState(null, "", pending?.returnTo || location.pathname);
  if (error) return `Sign-in was refused: ${params.get("error_description") || error}`;
  if (!pending || pending.state !== params.get("state")) {
    return "That sign-in did not start here (state mismatch). Please sign in again.";
  }
  const config = await loadConfig();
  const response = await fetch(config.token_url, {
    method: "POST",
    headers: { "content-type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams({
      grant_type: "authorization_code",
      client_id: config.client_id,
      code,
      redirect_uri: redirectUri(),
      code_verifier: pending.verifier,
    }),
  }).catch(() => null);
  const tokens = response && response.ok ? await response.json().catch(() => null) : null;
  if (!tokens?.id_token) return "The sign-in could not be completed. Please try again.";
  sessionStorage.setItem(TOKEN_KEY, tokens.id_token);
  return null;
}

/**
 * The sign-in box in `container`: who is signed in and a sign-out button, or the way to
 * sign in. `onChange` runs after every sign-in or sign-out.
 */
export async function renderSignIn(container, { onChange, adminDefault = false } = {}) {
  const config = await loadConfig();
  const session = await currentSession();
  container.replaceChildren();
  if (session) {
    const who = document.createElement("span");
    who.className = "who";
    who.dataset.testid = "signed-in-as";
    who.textContent = `Signed in as ${session.user}${session.admin ? " (admin)" : ""}`;
    const out = button("Sign out", "secondary", () => {
      signOut();
      if (config.auth === "oidc" && config.logout_url) {
        const url = new URL(config.logout_url);
        url.search = new URLSearchParams({ client_id: config.client_id, logout_uri: redirectUri() }).toString();
        location.assign(url.toString());
        return;
      }
      renderSignIn(container, { onChange, adminDefault }).then(() => onChange?.());
    });
    container.append(who, out);
    return session;
  }
  if (config.auth === "oidc") {
    container.append(button("Sign in", "primary", () => signInWithProvider()));
    return null;
  }
  const form = document.createElement("form");
  form.className = "signin";
  form.innerHTML = `
    <label>Sign in as <input name="user" required maxlength="128" autocomplete="username"
      placeholder="user id" data-testid="signin-user"></label>
    <label class="check"><input type="checkbox" name="admin" data-testid="signin-admin"> admin</label>
    <button type="submit" class="primary" data-testid="signin-submit">Sign in</button>
    <span class="hint">local stack</span>
    <p class="error" role="alert" hidden></p>`;
  form.elements.admin.checked = adminDefault;
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const error = await signInLocally(form.elements.user.value.trim(), form.elements.admin.checked);
    if (error) {
      const p = form.querySelector(".error");
      p.textContent = error;
      p.hidden = false;
      return;
    }
    await renderSignIn(container, { onChange, adminDefault });
    onChange?.();
  });
  container.append(form);
  return null;
}

function button(label, kind, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = kind;
  b.textContent = label;
  b.addEventListener("click", onClick);
  return b;
}
