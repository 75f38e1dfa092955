"""The official `openai` Python client against a running `runit serve`.

Run by crates/cli/tests/openai_client.rs, which starts the server and a venv with `openai`:

    python openai_client.py --base-url http://127.0.0.1:PORT/v1 --suite full
    python openai_client.py --base-url http://127.0.0.1:PORT/v1 --suite smoke
    python openai_client.py --base-url http://127.0.0.1:PORT/v1 --suite tools

`full` checks the API surface on a small (synthetic) model: chat and completions, plain and
streamed, stop sequences, max_tokens, seeds, log-probabilities, n=2, include_usage, 16
concurrent streaming clients whose greedy outputs equal the same requests run alone, and
`responses.create` (whole, streamed, through the stream helper, and its refusals). `smoke`
asks a real instruction model a question. `tools` runs a tool-calling loop (a forced call,
the tool's result, the final answer; and the call streamed) on a model served with a template
that takes tools, then the same loop through `responses.create` (a `function_call` item, its
`function_call_output`, the answer). Exits non-zero on the first failed check.
"""

import argparse
import asyncio
import json
import math
import sys

import openai

CHECKS = []


def check(function):
    CHECKS.append(function)
    return function


def chat_message(content):
    return [{"role": "user", "content": content}]


def greedy_chat(client, model, content, max_tokens=12, **extra):
    return client.chat.completions.create(
        model=model,
        messages=chat_message(content),
        temperature=0,
        max_tokens=max_tokens,
        **extra,
    )


def greedy_completion(client, model, prompt, max_tokens=12, **extra):
    return client.completions.create(
        model=model, prompt=prompt, temperature=0, max_tokens=max_tokens, **extra
    )


def stream_chat_text(client, model, content, max_tokens=12, **extra):
    """Concatenated deltas of a streamed greedy chat, the finish reason and the chunks."""
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=chat_message(content),
            temperature=0,
            max_tokens=max_tokens,
            stream=True,
            **extra,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    return text, [r for r in reasons if r], chunks


@check
def models_list(client, model):
    ids = [m.id for m in client.models.list().data]
    assert ids == [model], ids


@check
def chat_plain_and_streamed(client, model):
    whole = greedy_chat(client, model, "Hello there", max_tokens=10)
    assert whole.object == "chat.completion"
    choice = whole.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length"), choice.finish_reason
    assert 1 <= whole.usage.completion_tokens <= 10, whole.usage
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    text, reasons, chunks = stream_chat_text(client, model, "Hello there", max_tokens=10)
    assert text == choice.message.content, (text, choice.message.content)
    assert reasons == [choice.finish_reason], reasons
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1, "one id per stream"


@check
def completion_plain_and_streamed(client, model):
    whole = greedy_completion(client, model, "Once upon a time", max_tokens=12)
    assert whole.object == "text_completion"
    text = whole.choices[0].text
    assert text, "the model answers something"
    chunks = list(
        client.completions.create(
            model=model, prompt="Once upon a time", temperature=0, max_tokens=12, stream=True
        )
    )
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed == text, (streamed, text)
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


@check
def include_usage(client, model):
    whole = greedy_chat(client, model, "Count with me", max_tokens=8)
    text, _, chunks = stream_chat_text(
        client, model, "Count with me", max_tokens=8, stream_options={"include_usage": True}
    )
    assert text == whole.choices[0].message.content
    last = chunks[-1]
    assert last.choices == [], "the usage chunk has no choices"
    assert last.usage is not None
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert last.usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1]), "only the last chunk has usage"
    # Without the option no chunk carries usage.
    _, _, chunks = stream_chat_text(client, model, "Count with me", max_tokens=8)
    assert all(c.usage is None for c in chunks)


@check
def max_tokens(client, model):
    for limit in (1, 3, 7):
        whole = greedy_completion(client, model, "The weather today", max_tokens=limit)
        used = whole.usage.completion_tokens
        reason = whole.choices[0].finish_reason
        assert used <= limit, (limit, used)
        assert (used == limit) == (reason == "length"), (limit, used, reason)


@check
def stop_sequences(client, model):
    prompt = "In the beginning"
    full = greedy_completion(client, model, prompt, max_tokens=24).choices[0].text
    assert len(full) >= 6, f"need a longer answer to cut: {full!r}"
    # A stop string taken from the middle of the answer: the text ends right before its
    # first occurrence.
    start = len(full) // 2
    stop = full[start : start + 2]
    expected = full[: full.index(stop)]
    cut = greedy_completion(client, model, prompt, max_tokens=24, stop=[stop, "\u2603never"])
    assert cut.choices[0].text == expected, (cut.choices[0].text, expected, stop)
    assert cut.choices[0].finish_reason == "stop"
    # The same through the stream, and through chat.
    chunks = list(
        client.completions.create(
            model=model, prompt=prompt, temperature=0, max_tokens=24, stop=stop, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    answer = greedy_chat(client, model, "Tell me a story", max_tokens=24).choices[0].message.content
    if len(answer) >= 4:
        stop = answer[len(answer) // 2 :][:2]
        cut = greedy_chat(client, model, "Tell me a story", max_tokens=24, stop=stop)
        assert cut.choices[0].message.content == answer[: answer.index(stop)]
        assert cut.choices[0].finish_reason == "stop"


@check
def seed_reproducibility(client, model):
    def sample(seed):
        return client.completions.create(
            model=model, prompt="Pick a word:", temperature=1.0, max_tokens=16, seed=seed
        ).choices[0].text

    first = sample(1234)
    assert sample(1234) == first, "the same seed gives the same text"
    others = {sample(seed) for seed in (1, 2, 3, 4)}
    assert others != {first}, "different seeds give different texts"


@check
def chat_logprobs(client, model):
    whole = greedy_chat(client, model, "Hello", max_tokens=6, logprobs=True, top_logprobs=3)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    for token in content:
        assert token.logprob <= 1e-6, token
        assert len(token.top_logprobs) == 3, token
        tops = [t.logprob for t in token.top_logprobs]
        assert tops == sorted(tops, reverse=True), tops
        # Greedy: the chosen token is the most likely one.
        assert math.isclose(token.logprob, tops[0], abs_tol=1e-5), (token.logprob, tops)
        assert sum(math.exp(t) for t in tops) <= 1.0 + 1e-4
    # Bytes of the chosen tokens spell the answer.
    joined = b"".join(bytes(t.bytes) for t in content)
    assert joined.decode("utf-8", "replace") == whole.choices[0].message.content
    plain = greedy_chat(client, model, "Hello", max_tokens=6)
    assert plain.choices[0].logprobs is None


@check
def completion_logprobs(client, model):
    whole = greedy_completion(client, model, "Once upon a time", max_tokens=6, logprobs=2)
    logprobs = whole.choices[0].logprobs
    assert "".join(logprobs.tokens) == whole.choices[0].text
    assert len(logprobs.token_logprobs) == len(logprobs.tokens)
    assert all(len(top) <= 2 for top in logprobs.top_logprobs)
    offsets = logprobs.text_offset
    assert offsets == sorted(offsets) and offsets[0] == 0, offsets


@check
def two_choices(client, model):
    greedy = greedy_chat(client, model, "Say something", max_tokens=8, n=2)
    assert [c.index for c in greedy.choices] == [0, 1]
    first, second = (c.message.content for c in greedy.choices)
    assert first == second, "greedy choices agree"
    alone = greedy_chat(client, model, "Say something", max_tokens=8)
    assert first == alone.choices[0].message.content
    assert greedy.usage.completion_tokens == 2 * alone.usage.completion_tokens
    sampled = client.completions.create(
        model=model, prompt="Pick a word:", temperature=1.0, max_tokens=16, seed=7, n=2
    )
    assert len(sampled.choices) == 2
    chunks = list(
        client.completions.create(
            model=model, prompt="Pick a word:", temperature=1.0, max_tokens=16, seed=7, n=2,
            stream=True,
        )
    )
    for index in (0, 1):
        streamed = "".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == index)
        assert streamed == sampled.choices[index].text, (index, streamed)


@check
def concurrent_streams_equal_alone(client, model):
    prompts = [f"Story number {i}: once there was" for i in range(16)]
    lengths = [8 + (i * 5) % 24 for i in range(16)]
    alone = [
        greedy_chat(client, model, p, max_tokens=n).choices[0].message.content
        for p, n in zip(prompts, lengths)
    ]
    assert all(alone) and len(set(alone)) > 8, "the prompts get distinct answers"
    async_client = openai.AsyncOpenAI(base_url=client.base_url, api_key=client.api_key)

    async def one(prompt, limit):
        stream = await async_client.chat.completions.create(
            model=model,
            messages=chat_message(prompt),
            temperature=0,
            max_tokens=limit,
            stream=True,
        )
        parts = []
        async for chunk in stream:
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
        return "".join(parts)

    async def all_at_once():
        return await asyncio.gather(*(one(p, n) for p, n in zip(prompts, lengths)))

    together = asyncio.run(all_at_once())
    for i, (a, b) in enumerate(zip(alone, together)):
        assert a == b, f"request {i}: alone {a!r} vs concurrent {b!r}"


@check
def errors_raise(client, model):
    try:
        greedy_chat(client, model, "Hi", max_tokens=0)
    except openai.BadRequestError as error:
        assert error.status_code == 400
        assert error.body["param"] == "max_tokens", error.body
    else:
        raise AssertionError("max_tokens=0 is refused")
    try:
        client.chat.completions.create(model="no-such-model", messages=chat_message("Hi"))
    except openai.NotFoundError as error:
        assert error.body["code"] == "model_not_found", error.body
    else:
        raise AssertionError("an unknown model is refused")


@check
def responses_plain_and_streamed(client, model):
    whole = client.responses.create(
        model=model, input="Hello there", temperature=0, max_output_tokens=10,
        metadata={"run": "check"},
    )
    assert whole.object == "response" and whole.id.startswith("resp_"), whole
    assert whole.metadata == {"run": "check"}, whole.metadata
    chat = greedy_chat(client, model, "Hello there", max_tokens=10)
    choice = chat.choices[0]
    assert whole.output_text == choice.message.content, (whole.output_text, choice.message.content)
    expected = "incomplete" if choice.finish_reason == "length" else "completed"
    assert whole.status == expected, (whole.status, choice.finish_reason)
    if expected == "incomplete":
        assert whole.incomplete_details.reason == "max_output_tokens", whole.incomplete_details
    assert whole.usage.input_tokens == chat.usage.prompt_tokens, whole.usage
    assert whole.usage.output_tokens == chat.usage.completion_tokens, whole.usage
    assert whole.usage.total_tokens == whole.usage.input_tokens + whole.usage.output_tokens
    (message,) = whole.output
    assert message.type == "message" and message.role == "assistant", message

    events = list(
        client.responses.create(
            model=model, input="Hello there", temperature=0, max_output_tokens=10, stream=True
        )
    )
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created", events[0]
    assert events[-1].type == f"response.{expected}", events[-1]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text, (text, whole.output_text)
    assert events[-1].response.output_text == whole.output_text
    # The SDK's stream helper accepts the events in order and assembles the same text (its
    # final response needs `response.completed`, which an incomplete response does not send).
    with client.responses.stream(
        model=model, input="Hello there", temperature=0, max_output_tokens=10
    ) as stream:
        helped = list(stream)
        deltas = [e for e in helped if e.type == "response.output_text.delta"]
        assert deltas[-1].snapshot == whole.output_text, (deltas[-1].snapshot, whole.output_text)
        if expected == "completed":
            assert stream.get_final_response().output_text == whole.output_text


@check
def responses_refusals(client, model):
    for extra, param in (
        ({"store": True}, "store"),
        ({"previous_response_id": "resp_earlier"}, "previous_response_id"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ):
        try:
            client.responses.create(model=model, input="Hi", max_output_tokens=4, **extra)
        except openai.BadRequestError as error:
            assert error.body["param"] == param, error.body
        else:
            raise AssertionError(f"{extra} is refused")
    image = {"type": "input_image", "image_url": "https://example.com/a.png"}
    try:
        client.responses.create(
            model=model, input=[{"role": "user", "content": [image]}], max_output_tokens=4
        )
    except openai.BadRequestError as error:
        assert error.body["param"] == "input[0].content[0]", error.body
    else:
        raise AssertionError("an input image is refused")


def smoke(client, model):
    answer = greedy_chat(client, model, "What is the capital of France?", max_tokens=16)
    content = answer.choices[0].message.content
    assert "Paris" in content, content
    text, _, _ = stream_chat_text(client, model, "What is the capital of France?", max_tokens=16)
    assert text == content, (text, content)
    print(f"ok smoke: {content!r}")


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


def tools(client, model):
    question = chat_message("What is the weather in Paris?")
    first = client.chat.completions.create(
        model=model, messages=question, tools=[WEATHER_TOOL], tool_choice="required",
        parallel_tool_calls=False, temperature=0, max_tokens=80,
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather", call
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"city", "unit"}, arguments
    assert arguments["unit"] in ("celsius", "fahrenheit"), arguments

    streamed = client.chat.completions.create(
        model=model, messages=question, tools=[WEATHER_TOOL], tool_choice="required",
        parallel_tool_calls=False, temperature=0, max_tokens=80, stream=True,
    )
    names, pieces, reasons = [], [], []
    for chunk in streamed:
        delta = chunk.choices[0].delta
        for part in delta.tool_calls or []:
            if part.function.name:
                names.append(part.function.name)
            pieces.append(part.function.arguments or "")
        if chunk.choices[0].finish_reason:
            reasons.append(chunk.choices[0].finish_reason)
    assert names == ["get_weather"], names
    assert json.loads("".join(pieces)) == arguments, pieces
    assert len(pieces) > 2, f"arguments streamed in pieces as they are generated: {pieces}"
    assert reasons == ["tool_calls"], reasons

    answer = client.chat.completions.create(
        model=model,
        messages=question + [
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"celsius": 18})},
        ],
        tools=[WEATHER_TOOL], tool_choice="none", temperature=0, max_tokens=30,
    )
    final = answer.choices[0]
    assert final.message.tool_calls is None, final
    assert final.message.content, final
    print(f"ok tools: {call.function.arguments} -> {final.message.content!r}")
    responses_tools(client, model, arguments)


def responses_tools(client, model, arguments):
    """The same loop through the Responses API: the chat loop's `arguments` are expected."""
    tool = {"type": "function", **WEATHER_TOOL["function"], "strict": True}
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.responses.create(
        model=model, input=question, tools=[tool], tool_choice="required",
        parallel_tool_calls=False, temperature=0, max_output_tokens=80,
    )
    assert first.status == "completed", first
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather", call
    assert json.loads(call.arguments) == arguments, (call.arguments, arguments)

    events = list(
        client.responses.create(
            model=model, input=question, tools=[tool], tool_choice="required",
            parallel_tool_calls=False, temperature=0, max_output_tokens=80, stream=True,
        )
    )
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert "".join(pieces) == call.arguments, pieces
    assert len(pieces) > 2, f"arguments streamed in pieces as they are generated: {pieces}"
    (done,) = [e for e in events if e.type == "response.output_item.done"]
    assert done.item.type == "function_call" and done.item.arguments == call.arguments, done
    assert events[-1].type == "response.completed", events[-1]

    answer = client.responses.create(
        model=model,
        input=question + first.output + [
            {"type": "function_call_output", "call_id": call.call_id,
             "output": json.dumps({"celsius": 18})},
        ],
        tools=[tool], tool_choice="none", temperature=0, max_output_tokens=30,
    )
    assert [item.type for item in answer.output] == ["message"], answer.output
    assert answer.output_text, answer
    print(f"ok responses tools: {call.arguments} -> {answer.output_text!r}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--suite", choices=("full", "smoke", "tools"), default="full")
    parser.add_argument("--api-key", default="none")
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    if args.suite == "smoke":
        smoke(client, model)
        return 0
    if args.suite == "tools":
        tools(client, model)
        return 0
    failed = 0
    for function in CHECKS:
        try:
            function(client, model)
        except Exception as error:  # report every failing check, then fail
            failed += 1
            print(f"FAIL {function.__name__}: {type(error).__name__}: {error}", flush=True)
        else:
            print(f"ok {function.__name__}", flush=True)
    print(f"{len(CHECKS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
