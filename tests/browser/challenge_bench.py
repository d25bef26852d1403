"""The proof-of-work challenge in Chromium, measured (issue 16 §1): `make bench-challenge`.

1. Solve time per difficulty: the page's own worker (web/assets/challenge-worker.js)
   solves real challenges of the local stack, one at a time, in headless Chromium pinned
   to one core (this process pins itself to CPU 0 before launching it, and Chromium's
   processes inherit that). Median, p10 and p90, and derivations per second.
2. The pulse, spread: PAGES buyer pages, signed in, their Buy buttons clicked by a timer
   at the same wall-clock instant; half of them behind a network 150 ms slower (every
   request of theirs waits 150 ms first, in the page). When each page sends its token
   request is recorded in the page (`Date.now()` as the request leaves, after the delay).
   With the challenge off and on, ROUNDS rounds each: the p10-p90 spread of the token
   requests, and the fast half's share of the first 20 % of them, per round and pooled.

3. What a bot pays: the load tool's `--challenge` (release build) surges a sale of the
   same stack, solving every challenge in native Rust on its own threads, each timed on
   its thread's CPU clock: derivations per solve and solves per core-second, beside the
   page's rate from 1.

Prints a Markdown report and writes it to docs/challenge.md (the raw arrivals beside it,
in target/challenge-pulse.json).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import CHROMIUM, CHROMIUM_ARGS, ROOT, LocalStack  # noqa: E402

SLOWER_NETWORK_MS = 150

# Every request the page makes waits first, as on a slower network; the token request's
# departure is recorded after that wait.
SLOW_AND_RECORDED = """
(() => {
  const slow = %(slow)s;
  const original = window.fetch.bind(window);
  window.tokenSentAt = null;
  window.fetch = async (input, init) => {
    if (slow) await new Promise((resolve) => setTimeout(resolve, %(delay)d));
    const url = typeof input === "string" ? input : input.url;
    // The token route, not the local sign-in's /local/token.
    if (/\/sales\/[^/]+\/token$/.test(url) && window.tokenSentAt === null) window.tokenSentAt = Date.now();
    return original(input, init);
  };
})();
"""


def percentile(values, fraction):
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def solve_times(browser, stack, work, solves):
    """Solves `solves` challenges of a sale of `work`, one after another, in one page."""
    sale_id, _ = stack.create_sale(stock=1, prefix="solve", challenge_work=work)
    token = stack.token(f"solver-{work}")
    page = browser.new_page()
    page.goto(stack.url + "/")
    results = []
    for _ in range(solves):
        status, challenge = stack.call("GET", f"/sales/{sale_id}/challenge", token=token)
        assert status == 200, challenge
        answer = page.evaluate(
            """async (challenge) => {
              const worker = new Worker("assets/challenge-worker.js");
              const started = performance.now();
              const result = await new Promise((resolve) => {
                worker.onmessage = ({ data }) => { if (data.solution || data.error) resolve(data); };
                worker.postMessage(challenge);
              });
              worker.terminate();
              return { ...result, wall: performance.now() - started };
            }""",
            challenge,
        )
        assert "solution" in answer, answer
        status, _ = stack.call(
            "POST", f"/sales/{sale_id}/token", token=token,
            body={"challenge": challenge, "solution": answer["solution"]},
        )
        assert status == 200, "the page's solution must verify"
        results.append((answer["wall"] / 1000, answer["derivations"]))
    page.close()
    return results


def release_round(browser, stack, work, pages_count):
    """One round: `pages_count` pages click Buy at one instant; when each sent its token."""
    sale_id, _ = stack.create_sale(stock=pages_count, prefix="pulse", challenge_work=work)
    contexts, pages = [], []
    for index in range(pages_count):
        slow = index % 2 == 1
        context = browser.new_context()
        context.add_init_script(SLOW_AND_RECORDED % {"slow": "true" if slow else "false", "delay": SLOWER_NETWORK_MS})
        page = context.new_page()
        page.goto(f"{stack.url}/?sale={sale_id}")
        page.get_by_test_id("signin-user").fill(f"pulse-{index}-{time.time_ns()}")
        page.get_by_test_id("signin-submit").click()
        contexts.append(context)
        pages.append((page, slow))
    for page, _ in pages:
        page.wait_for_function("() => !document.querySelector('#buy').disabled", timeout=60_000)
    release_at = int(time.time() * 1000) + 1500
    for page, _ in pages:
        page.evaluate("(at) => setTimeout(() => document.querySelector('#buy').click(), at - Date.now())", release_at)
    sent = []
    for page, slow in pages:
        page.wait_for_function("() => window.tokenSentAt !== null", timeout=180_000)
        sent.append(((page.evaluate("() => window.tokenSentAt") - release_at) / 1000, slow))
    for context in contexts:
        context.close()
    times = [at for at, _ in sent]
    first = sorted(sent)[: max(1, len(sent) // 5)]
    fast_share = sum(1 for _, slow in first if not slow) / len(first)
    return {
        "spread_p10_p90_s": percentile(times, 0.9) - percentile(times, 0.1),
        "fast_share_of_first_fifth": fast_share,
        "first_fifth": len(first),
        "sent": sent,
    }


def bot_solves(load_bin, stack, work, buyers):
    """A surge of `buyers` with the load tool solving each challenge in Rust."""
    with tempfile.TemporaryDirectory() as scratch:
        report_path = Path(scratch) / "report.json"
        run = subprocess.run(
            [
                str(load_bin), "--api", stack.url,
                "--sale-id", f"bot-{work}-{int(time.time() * 1000)}",
                "--stock", "10", "--shards", "2",
                "--buyers", str(buyers), "--attempts", str(buyers),
                "--challenge", str(work), "--report", str(report_path),
            ],
            capture_output=True, text=True, timeout=900,
        )
        if run.returncode != 0:
            raise RuntimeError(f"the load tool failed ({run.returncode}):\n{run.stdout}\n{run.stderr}")
        return json.loads(report_path.read_text())["challenge"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--works", default="20000,50000,200000")
    parser.add_argument("--solves", type=int, default=15)
    parser.add_argument("--pages", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pulse-work", type=int, default=20000)
    parser.add_argument("--report", default=str(ROOT / "docs" / "challenge.md"))
    parser.add_argument("--bot-works", default="20000,50000")
    parser.add_argument("--bot-buyers", type=int, default=200)
    parser.add_argument("--load-bin", default=str(ROOT / "target" / "release" / "flashsale-load"))
    args = parser.parse_args()
    bot_works = [int(w) for w in args.bot_works.split(",") if w]
    if bot_works and not Path(args.load_bin).exists():
        sys.exit(f"{args.load_bin} is missing: cargo build --release -p flashsale-load --bin flashsale-load")

    binary = ROOT / "target" / "debug" / "flashsale-local"
    stack = LocalStack(binary)
    stack.start()
    lines = [
        "# The challenge in Chromium",
        "",
        f"Written by `make bench-challenge` ({time.strftime('%Y-%m-%d')}, headless Debian Chromium, "
        f"{os.cpu_count()} cores). Raw arrivals: target/challenge-pulse.json.",
        "",
    ]
    every_core = os.sched_getaffinity(0)
    try:
        with sync_playwright() as playwright:
            # One core for the solve times: Chromium and its workers inherit the pin.
            os.sched_setaffinity(0, {min(every_core)})
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            works = [int(w) for w in args.works.split(",") if w]
            if works:
                lines += [
                    f"## Solve time per difficulty ({args.solves} solves each, one at a time)", "",
                    "| work (derivations at most) | median solve | p10 | p90 | derivations/s |",
                    "|---:|---:|---:|---:|---:|",
                ]
            for work in works:
                results = solve_times(browser, stack, work, args.solves)
                seconds = [s for s, _ in results]
                rate = sum(d for _, d in results) / sum(seconds)
                lines.append(
                    f"| {work:,} | {statistics.median(seconds):.2f} s | {percentile(seconds, 0.1):.2f} s "
                    f"| {percentile(seconds, 0.9):.2f} s | {rate:,.0f} |"
                )
                print(lines[-1], flush=True)
            browser.close()
            os.sched_setaffinity(0, every_core)
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            raw = {}
            pulses = [("off", 0), (f"on ({args.pulse_work:,})", args.pulse_work)] if args.rounds else []
            if pulses:
                lines += [
                "", f"## The pulse: {args.pages} pages released at one instant, half {SLOWER_NETWORK_MS} ms slower",
                "", "| challenge | round | token requests' spread (p10-p90) | fast half's share of the first 20 % |",
                "|---|---:|---:|---:|",
                ]
            for label, work in pulses:
                rounds = [release_round(browser, stack, work, args.pages) for _ in range(args.rounds)]
                raw[label] = rounds
                for number, result in enumerate(rounds, 1):
                    lines.append(
                        f"| {label} | {number} | {result['spread_p10_p90_s']:.2f} s "
                        f"| {result['fast_share_of_first_fifth']:.0%} of {result['first_fifth']} |"
                    )
                    print(lines[-1], flush=True)
                firsts = sum(r["first_fifth"] for r in rounds)
                fast = sum(r["fast_share_of_first_fifth"] * r["first_fifth"] for r in rounds)
                lines.append(f"| {label} | pooled | median {statistics.median(r['spread_p10_p90_s'] for r in rounds):.2f} s | {fast / firsts:.0%} of {firsts} |")
                print(lines[-1], flush=True)
            browser.close()
        page_rate = rate if works else None
        if bot_works:
            lines += [
                "", f"## What a bot pays: the load tool's `--challenge`, native Rust ({args.bot_buyers} solves each)", "",
                "Each solve runs on a thread of its own, timed on that thread's CPU clock, while the tool's "
                "other requests run beside it.", "",
                "| work | derivations per solve, mean · p50 · p90 | CPU per solve, mean · p90 | solves per core-second "
                "| derivations per core-second | × the page's rate |",
                "|---:|---:|---:|---:|---:|---:|",
            ]
        for work in bot_works:
            cost = bot_solves(args.load_bin, stack, work, args.bot_buyers)
            versus = f"{cost['derivations_per_core_second'] / page_rate:.1f}×" if page_rate else "-"
            lines.append(
                f"| {work:,} | {cost['derivations_mean']:,.0f} · {cost['derivations_p50']:,.0f} · "
                f"{cost['derivations_p90']:,.0f} | {cost['cpu_ms']['mean_ms']:.0f} ms · {cost['cpu_ms']['p90_ms']:.0f} ms "
                f"| {cost['solves_per_core_second']:.2f} | {cost['derivations_per_core_second']:,.0f} | {versus} |"
            )
            print(lines[-1], flush=True)
    finally:
        stack.stop()
    report = "\n".join(lines) + "\n"
    Path(args.report).parent.mkdir(parents=True, exist_ok=True)
    Path(args.report).write_text(report)
    (ROOT / "target").mkdir(exist_ok=True)
    (ROOT / "target" / "challenge-pulse.json").write_text(json.dumps(raw, indent=1))
    print(report)


if __name__ == "__main__":
    main()
