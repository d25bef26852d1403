// Solves the proof-of-work challenge before a grab path, off the page's thread: ALTCHA's
// PoW v2 in deterministic mode with PBKDF2/SHA-256, as functions/lib/adapters issues it. The
// key for each counter, from 0 up, is PBKDF2(nonce || counter as 4 big-endian bytes,
// salt, cost iterations); the solution is the first counter whose key starts with
// `keyPrefix`.
//
// These few lines instead of ALTCHA's widget: the pages have no build step and a strict
// Content-Security-Policy (the widget brings its own styles and UI), and the page shows
// its own honest progress. WebCrypto does the hashing natively, as the widget's does.

const hex = (bytes) => Array.from(bytes, (byte) => byte.toString(16).padStart(2, "0")).join("");
const bytesOf = (text) => new Uint8Array(text.match(/../g).map((pair) => parseInt(pair, 16)));

/** How often progress is posted: often enough for a smooth bar, rarely enough to cost nothing. */
const PROGRESS_EVERY_MS = 100;

self.onmessage = async ({ data: challenge }) => {
  try {
    const parameters = challenge.parameters;
    const nonce = bytesOf(parameters.nonce);
    const salt = bytesOf(parameters.salt);
    const prefix = parameters.keyPrefix.toLowerCase();
    const work = parameters.data?.work || 0;
    const password = new Uint8Array(nonce.length + 4);
    password.set(nonce);
    const counterAt = new DataView(password.buffer, nonce.length, 4);
    const started = performance.now();
    let reported = started;
    for (let counter = 0; counter <= 0xffffffff; counter += 1) {
      counterAt.setUint32(0, counter, false);
      const key = await crypto.subtle.importKey("raw", password, "PBKDF2", false, ["deriveBits"]);
      const bits = await crypto.subtle.deriveBits(
        { name: "PBKDF2", hash: "SHA-256", salt, iterations: parameters.cost },
        key,
        parameters.keyLength * 8,
      );
      const derived = hex(new Uint8Array(bits));
      if (derived.startsWith(prefix)) {
        const time = performance.now() - started;
        self.postMessage({ solution: { counter, derivedKey: derived, time }, derivations: counter + 1 });
        return;
      }
      const now = performance.now();
      if (now - reported >= PROGRESS_EVERY_MS) {
        reported = now;
        self.postMessage({ progress: work ? Math.min(counter / work, 1) : null, derivations: counter + 1 });
      }
    }
    self.postMessage({ error: "no counter solves this challenge" });
  } catch (error) {
    self.postMessage({ error: String(error) });
  }
};
