"""`make fuzz-api`: schemathesis against a local stack this script starts and stops.

Starts the flashsale-local binary on free ports (its own DynamoDB Local and moto), waits
for its banner, runs schemathesis from openapi.yaml with the hooks in this folder, and
stops the stack whatever happened, leaving no process behind. The exit status is
schemathesis's: non-zero on any failed check.
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# A cold DynamoDB Local (Java) on a loaded 2-core machine took over a minute to start;
# the deadline only bounds a stack that will never come up.
STARTUP_DEADLINE_SECS = 600
STOP_DEADLINE_SECS = 120
API_URL_LINE = re.compile(r"^\s*HTTP API\s+(\S+)")

# Every check of this schemathesis version that judges the API against its contract,
# but `unsupported_method`: it wants 405 for a method the spec does not list, and an
# API Gateway HTTP API answers every undeclared route, whatever the method, with its own
# 404 `{"message": "Not Found"}` (GatewayRefusal), which no configuration changes.
CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
    "negative_data_rejection",
    "positive_data_acceptance",
    "missing_required_header",
    "ignored_auth",
    "use_after_free",
    "ensure_resource_availability",
]


def start_stack(local_bin, template, log_path):
    log = open(log_path, "w")
    stack = subprocess.Popen(
        [
            local_bin,
            "--template", str(template),
            "--stack-name", f"flashsale-fuzz-{os.getpid()}",
            "--api-port", "0",
            "--dynamodb-port", "0",
            "--moto-port", "0",
            "--sqs-port", "0",
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        # Its own session, so a last-resort kill reaches everything it started.
        start_new_session=True,
    )
    found = threading.Event()
    url = []

    # Drains stdout for the whole run, so the stack never blocks on a full pipe.
    def read_banner():
        for line in stack.stdout:
            log.write(line)
            log.flush()
            match = API_URL_LINE.match(line)
            if match and not found.is_set():
                url.append(match.group(1))
                found.set()

    threading.Thread(target=read_banner, daemon=True).start()
    deadline = time.monotonic() + STARTUP_DEADLINE_SECS
    while not found.wait(timeout=1):
        if stack.poll() is not None:
            raise RuntimeError(f"the local stack exited with {stack.returncode}; see {log_path}")
        if time.monotonic() > deadline:
            stop_stack(stack)
            raise RuntimeError(f"the local stack did not start in {STARTUP_DEADLINE_SECS} s; see {log_path}")
    return stack, url[0]


def stop_stack(stack):
    if stack.poll() is not None:
        return
    # SIGTERM: the stack stops its emulators itself.
    stack.send_signal(signal.SIGTERM)
    try:
        stack.wait(timeout=STOP_DEADLINE_SECS)
    except subprocess.TimeoutExpired:
        print("fuzz-api: the stack ignored SIGTERM; killing its session", file=sys.stderr)
        os.killpg(stack.pid, signal.SIGKILL)
        stack.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--local-bin", required=True)
    parser.add_argument("--schemathesis", required=True)
    parser.add_argument("--schema", default="openapi.yaml")
    parser.add_argument("--template", default="template.yaml")
    parser.add_argument("--out-dir", default="target/fuzz-api")
    parser.add_argument("--max-examples", type=int, default=25)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=int, default=900, help="hard limit of the schemathesis run")
    args = parser.parse_args()

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stack, api_url = start_stack(args.local_bin, args.template, out_dir / "stack.log")
    try:
        print(f"fuzz-api: local stack up at {api_url}", flush=True)
        env = dict(os.environ)
        env["FLASHSALE_FUZZ_API_URL"] = api_url
        env["SCHEMATHESIS_HOOKS"] = "hooks"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
        command = [
            args.schemathesis,
            "--config-file", str(HERE / "schemathesis.toml"),
            "run", args.schema,
            "--url", api_url,
            "--checks", ",".join(CHECKS),
            "--phases", "examples,coverage,fuzzing,stateful",
            "--max-examples", str(args.max_examples),
            # A fixed seed: the same requests every run, so a failure reproduces and a
            # pass means the same thing each time. Change it (FUZZ_SEED) to explore.
            "--seed", str(args.seed),
            # One worker: with two threads, hypothesis describing a strategy's filter
            # parses source with `ast` in both at once, and CPython 3.11.7's AST
            # constructor's recursion check is not thread-safe: a run here errored "AST
            # constructor recursion depth mismatch" on an operation it had passed before.
            # Measured here: 16.1 s with two workers, 13.8 s with one.
            "--workers", "1",
            "--request-timeout", "30",
            "--report", "junit,ndjson",
            "--report-dir", str(out_dir),
        ]
        try:
            return subprocess.run(command, env=env, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            print(f"fuzz-api: schemathesis did not finish in {args.timeout} s", file=sys.stderr)
            return 1
    finally:
        stop_stack(stack)


if __name__ == "__main__":
    sys.exit(main())
