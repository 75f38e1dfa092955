#!/usr/bin/env python3
"""Throughput and latency of `runit serve`: aggregate generated tokens per second with N
concurrent greedy streaming requests against one request at a time, and time to first token
(p50/p95). Each round runs one request alone and then the concurrent batch; the speed-up is
the median of the rounds' ratios. Standard library only.

    # against a running server
    python3 scripts/serve_bench.py --base-url http://127.0.0.1:8080
    # or start one (on a free port, with --parallel set to the concurrency)
    python3 scripts/serve_bench.py --runit target/release/runit \\
        --model models/SmolLM2-135M-Instruct.Q4_1.gguf --threads 2

Requests are text completions with distinct story prompts, `temperature: 0`, `max_tokens`
tokens and `stream_options.include_usage`, so token counts come from the server's usage.
Every request generates exactly `max_tokens` tokens (`ignore_eos`, as vLLM's and llama.cpp's
serving benchmarks do), so each round's batch holds all its sequences to the end; with
`--allow-eos` a request may stop at its end of text and counts the tokens it did generate.
"""

import argparse
import http.client
import json
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

PROMPTS = [
    "Once upon a time, in a village by the sea,",
    "The old lighthouse keeper had a secret:",
    "In the year 2150, the first city on Mars",
    "The recipe my grandmother never wrote down",
    "Deep in the forest there lived a fox who",
    "The train was late again, and Maria",
    "When the robot first learned to paint,",
    "Nobody in the small town knew why the bell",
    "The library at midnight was full of",
    "On the morning of the big race,",
    "The map showed an island that",
    "Every winter the river froze and",
    "The letter arrived forty years too late:",
    "At the top of the mountain, the monk",
    "The inventor's strangest machine",
    "Under the bridge lived a musician who",
]


def stream_request(host, port, prompt, max_tokens, model, ignore_eos=False):
    """One streamed completion: (time to first token, end time, completion tokens, start,
    arrival times of its content chunks)."""
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True
    if model:
        body["model"] = model
    connection = http.client.HTTPConnection(host, port, timeout=600)
    start = time.perf_counter()
    connection.request(
        "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
    )
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {response.read()[:300]!r}")
    first = None
    tokens = 0
    arrivals = []
    for line in response:
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        if b'"usage"' not in data:
            arrivals.append(time.perf_counter())
        # Only the chunks that matter are decoded (the first with text, and the usage one),
        # so that the client, which shares the machine's cores with the server, takes as
        # little of them as it can.
        if first is not None and b'"usage"' not in data:
            continue
        chunk = json.loads(data)
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        elif first is None and chunk["choices"] and chunk["choices"][0]["text"]:
            first = time.perf_counter() - start
    end = time.perf_counter()
    connection.close()
    return first if first is not None else end - start, end, tokens, start, arrivals


def make_prompt(args, index):
    """The `index`th prompt: a story opening, or `--prompt-tokens` token ids."""
    if not args.prompt_tokens:
        return PROMPTS[index % len(PROMPTS)]
    generator = random.Random(index)
    return [generator.randrange(100, 1000) for _ in range(args.prompt_tokens)]


def decode_rate(results):
    """Tokens per second while every stream of a batch decodes: from the moment the last
    stream received its first chunk (every prompt has been processed) to the last stream's
    end, counting each stream's tokens in that window in proportion to its content chunks
    there. The figure llama-batched-bench reports as S_TG (decode only, prompts excluded)."""
    firsts = [r[4][0] for r in results if r[4]]
    if not firsts:
        return None
    begin, end = max(firsts), max(r[1] for r in results)
    if end <= begin:
        return None
    tokens = 0.0
    for _, _, count, _, arrivals in results:
        if arrivals:
            tokens += count * sum(1 for t in arrivals if t > begin) / len(arrivals)
    return tokens / (end - begin)


def run_batch(host, port, prompts, max_tokens, model, ignore_eos):
    """Runs `prompts` at once; returns (aggregate tok/s, time to first token list, tokens,
    decode-phase tok/s)."""
    results = [None] * len(prompts)
    errors = []

    def worker(i, prompt):
        try:
            results[i] = stream_request(host, port, prompt, max_tokens, model, ignore_eos)
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i, p)) for i, p in enumerate(prompts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    begin = min(r[3] for r in results)
    end = max(r[1] for r in results)
    tokens = sum(r[2] for r in results)
    return tokens / (end - begin), [r[0] for r in results], tokens, decode_rate(results)


def scrape_steps(host, port):
    """The scheduler's step counters from /metrics (steps, seconds whole, in passes, on the
    host), or None where the server has none."""
    names = ["runit_steps_total", "runit_step_seconds_total",
             "runit_step_pass_seconds_total", "runit_step_host_seconds_total"]
    try:
        connection = http.client.HTTPConnection(host, port, timeout=10)
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        if response.status != 200:
            return None
        values = {}
        for line in response.read().decode().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] in names:
                values[parts[0]] = float(parts[1])
        return [values[name] for name in names] if len(values) == len(names) else None
    except OSError:
        return None


def percentile(values, fraction):
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(args):
    port = free_port()
    command = [
        args.runit, "serve", "--model", args.model, "--port", str(port),
        "--parallel", str(args.concurrency), "--ctx-size", str(args.ctx_size),
    ]
    if args.threads:
        command += ["--threads", str(args.threads)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline:
        if process.poll() is not None:
            sys.exit(f"runit serve exited with {process.returncode}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return process, port
        except OSError:
            time.sleep(0.2)
    process.kill()
    sys.exit("runit serve did not come up")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", help="a running server, e.g. http://127.0.0.1:8080")
    parser.add_argument("--runit", help="the runit binary, to start a server")
    parser.add_argument("--model", help="GGUF file for the started server")
    parser.add_argument("--threads", type=int, help="--threads of the started server")
    parser.add_argument("--ctx-size", type=int, default=4096)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int,
                        help="prompts of exactly N token ids (distinct per request, seeded), as "
                             "llama-batched-bench's -npp, instead of the short story prompts")
    parser.add_argument("--allow-eos", action="store_true",
                        help="let requests stop at their end of text (default: ignore_eos)")
    parser.add_argument("--rounds", type=int, default=2, help="repeats of each measurement")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    ignore_eos = not args.allow_eos
    process = None
    if args.base_url:
        url = urllib.parse.urlparse(args.base_url)
        host, port = url.hostname, url.port or 80
    elif args.runit and args.model:
        process, port = start_server(args)
        host = "127.0.0.1"
    else:
        parser.error("give --base-url, or --runit and --model")
    try:
        # Warm up (page in the weights) before timing.
        stream_request(host, port, "Hello", 8, None)
        steps_before = scrape_steps(host, port)
        # Each round measures one request alone, then the concurrent batch, so that the two
        # figures of a round come from the same few seconds of a shared machine (whose speed
        # drifts); the speed-up is the median of the rounds' ratios.
        single_rates, single_ttft = [], []
        batch_rates, batch_ttft, batch_tokens, decode_rates = [], [], [], []
        for round_index in range(args.rounds):
            prompt = make_prompt(args, round_index * (args.concurrency + 1))
            rate, ttft, _, _ = run_batch(host, port, [prompt], args.max_tokens, None, ignore_eos)
            single_rates.append(rate)
            single_ttft += ttft
            prompts = [
                make_prompt(args, round_index * (args.concurrency + 1) + 1 + i)
                for i in range(args.concurrency)
            ]
            rate, ttft, tokens, decode = run_batch(
                host, port, prompts, args.max_tokens, None, ignore_eos
            )
            batch_rates.append(rate)
            if decode is not None:
                decode_rates.append(decode)
            batch_ttft += ttft
            batch_tokens.append(tokens)
        steps_after = scrape_steps(host, port)
    finally:
        if process:
            process.kill()
            process.wait()
    report = {
        "max_tokens": args.max_tokens,
        "ignore_eos": ignore_eos,
        "concurrency": args.concurrency,
        "single_tok_per_s": statistics.median(single_rates),
        "single_ttft_p50_s": percentile(single_ttft, 0.5),
        "concurrent_tok_per_s": statistics.median(batch_rates),
        "concurrent_tokens_per_round": batch_tokens,
        "concurrent_decode_tok_per_s": statistics.median(decode_rates) if decode_rates else None,
        "concurrent_ttft_p50_s": percentile(batch_ttft, 0.5),
        "concurrent_ttft_p95_s": percentile(batch_ttft, 0.95),
    }
    if steps_before and steps_after:
        steps, seconds, passes, host_seconds = (
            after - before for before, after in zip(steps_before, steps_after))
        if steps > 0:
            report["steps"] = int(steps)
            report["step_ms"] = 1000 * seconds / steps
            report["step_pass_fraction"] = passes / seconds
            report["step_host_fraction"] = host_seconds / seconds
    report["speedup"] = statistics.median(
        batch / single for batch, single in zip(batch_rates, single_rates)
    )
    report["speedup_per_round"] = [
        round(batch / single, 3) for batch, single in zip(batch_rates, single_rates)
    ]
    if args.json:
        print(json.dumps(report))
        return
    print(f"one request:   {report['single_tok_per_s']:8.1f} tok/s, "
          f"time to first token {report['single_ttft_p50_s'] * 1000:.0f} ms")
    print(f"{args.concurrency} concurrent:  {report['concurrent_tok_per_s']:8.1f} tok/s aggregate "
          f"({report['speedup']:.2f}x, median of the rounds' ratios "
          f"{report['speedup_per_round']}), time to first token "
          f"p50 {report['concurrent_ttft_p50_s'] * 1000:.0f} ms, "
          f"p95 {report['concurrent_ttft_p95_s'] * 1000:.0f} ms "
          f"(tokens per round: {batch_tokens})")
    if report["concurrent_decode_tok_per_s"]:
        print(f"decode phase:  {report['concurrent_decode_tok_per_s']:8.1f} tok/s aggregate while "
              f"all {args.concurrency} streams decode (prompts excluded, as llama-batched-bench's S_TG)")
    if "steps" in report:
        print(f"scheduler steps: {report['steps']}, {report['step_ms']:.2f} ms each, "
              f"{100 * report['step_pass_fraction']:.1f}% in forward passes, "
              f"{100 * report['step_host_fraction']:.1f}% on the host (/metrics)")


if __name__ == "__main__":
    main()
