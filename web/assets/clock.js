// The server's clock, seen from the page. The device's wall clock may be minutes off, so
// the countdown never reads it: it reads the monotonic performance.now() plus an offset
// learnt from the `server_time` of the sale status.
//
// A response stamped `server_time` was stamped between the moment the request left
// (sentAt) and the moment the answer came back (receivedAt), so the offset
// server - performance lies in [server_time - receivedAt, server_time - sentAt]: the
// round trip bounds the error on both sides. Each sample narrows the interval; the
// estimate is its middle. A copy served from a cache (CDN hit, `Age` > 0, or
// `X-Cache: Hit`) was stamped before the request left, so it gives only the lower
// bound: it can never move the clock back.

export class ServerClock {
  constructor() {
    this.low = -Infinity;
    this.high = Infinity;
  }

  get synced() {
    return Number.isFinite(this.low);
  }

  /** Learns from one answer; times are performance.now() values. */
  sample(serverTimeMs, sentAt, receivedAt, fromCache) {
    if (!Number.isFinite(serverTimeMs)) return;
    const low = serverTimeMs - receivedAt;
    const high = fromCache ? Infinity : serverTimeMs - sentAt;
    // A server clock adjusted between samples can leave the intervals disjoint: trust
    // the newest sample alone then.
    if (low > this.high || high < this.low) {
      this.low = low;
      this.high = high;
      return;
    }
    this.low = Math.max(this.low, low);
    this.high = Math.min(this.high, high);
  }

  /** The offset estimate (ms to add to performance.now()). */
  get offset() {
    return Number.isFinite(this.high) ? (this.low + this.high) / 2 : this.low;
  }

  /** Half the remaining uncertainty, in ms (Infinity until a fresh sample). */
  get uncertainty() {
    return (this.high - this.low) / 2;
  }

  /** Server time now, in epoch ms. */
  now() {
    return performance.now() + this.offset;
  }
}

/** Whether a response came from a cache rather than the origin just now. */
export function servedFromCache(headers) {
  const age = Number.parseInt(headers.get("age") ?? "0", 10);
  const xCache = (headers.get("x-cache") || "").toLowerCase();
  return age > 0 || xCache.includes("hit");
}
