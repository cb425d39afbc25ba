"""The count of a JSON body's values from its bytes as they arrive (server/json_values.py): never
more than the values the body holds, wherever its chunks end and whatever its strings hold (so no
request within its budget is refused), short by one per non-empty array or object, and it refuses
the floods it is for."""

from __future__ import annotations

import json
import random

import pytest

from boundgen.errors import InvalidInput
from boundgen.server import json_values
from boundgen.server.json_values import ValueCount

TRICKY = ['"', "\\", '\\"', '\\\\"', ",", ":", ",:,", "[", "]{", "}", "\u00e9\u4e2d", "\U0001f600", "\n\t", "/", "a"]


def values(obj) -> int:
    """The values of a parsed JSON text (keys are strings, so values too)."""
    if isinstance(obj, list):
        return 1 + sum(values(v) for v in obj)
    if isinstance(obj, dict):
        return 1 + sum(1 + values(v) for v in obj.values())
    return 1


def containers(obj) -> int:
    """Its non-empty arrays and objects."""
    inner = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list) else ()
    return (1 if inner else 0) + sum(containers(v) for v in inner)


def random_json(rng: random.Random, depth: int = 0):
    kind = rng.random()
    if depth > 3 or kind < 0.3:
        return "".join(rng.choice(TRICKY) for _ in range(rng.randrange(4)))
    if kind < 0.45:
        return rng.choice([0, -1.5e300, 12345678901234567890, True, False, None])
    if kind < 0.75:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(6))]
    return {"".join(rng.choice(TRICKY) for _ in range(rng.randrange(3))) + str(i): random_json(rng, depth + 1)
            for i in range(rng.randrange(6))}


def counted(body: bytes, budget: int = 10**9, cuts=(), json_bytes=None, longest=None, total=None) -> ValueCount:
    count = ValueCount(budget, json_bytes, longest, total)
    edges = [0, *sorted(cuts), len(body)]
    for start, end in zip(edges, edges[1:]):
        count.feed(body[start:end])
    return count


@pytest.mark.parametrize("dumps", [
    lambda o: json.dumps(o).encode(),
    lambda o: json.dumps(o, ensure_ascii=False).encode(),
    lambda o: json.dumps(o, indent=2, separators=(" , ", " : ")).encode(),
], ids=["ascii", "utf8", "spaced"])
def test_a_lower_bound_short_by_the_containers_wherever_the_chunks_end(dumps):
    rng = random.Random(7)
    for _ in range(2000):
        obj = random_json(rng)
        body = dumps(obj)
        cuts = [rng.randrange(len(body) + 1) for _ in range(rng.randrange(6))]
        assert counted(body, cuts=cuts).values == values(obj) - containers(obj), (body, cuts)


def test_a_chunk_of_backslashes_waits_for_what_follows():
    body = json.dumps(["\\" * 7 + '"', "a,b"]).encode()  # ["\\\\\\\\\\\\\\\"", "a,b"]
    for cut in range(len(body) + 1):
        assert counted(body, cuts=[cut]).values == 2, cut
    assert counted(body, cuts=range(len(body) + 1)).values == 2


def test_a_body_at_its_budget_passes_and_two_values_more_are_refused():
    """999 texts in a list are 1000 values; 1001 texts, 1002 (counted 1001: the list is not counted)."""
    texts = ['\\",:[' * 20] * 999  # quotes, backslashes, commas and colons in every text
    assert not counted(json.dumps(texts).encode(), 1000, cuts=range(0, 200_000, 4096)).over
    over = counted(json.dumps(texts + ["x", "y"]).encode(), 1000, cuts=range(0, 200_000, 4096))
    with pytest.raises(InvalidInput, match="at least 1001 JSON values, more than the 1000 a request to model m"):
        over.check("the request body", "model m")


@pytest.mark.parametrize("flood", [
    b'{"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": [' + b",".join([b'"a"'] * 300_000) + b"]}]}",
    b"[" + b",".join([b"0"] * 300_000) + b"]",
    b"[" + b",".join([b"[]"] * 300_000) + b"]",
    b"{" + b",".join([b'"a":0'] * 300_000) + b"}",
    b'["' + b'\\\\",",' * 300_000 + b'"]',  # strings ending in an escaped backslash
], ids=["strings", "integers", "lists", "members", "escapes"])
def test_floods_are_refused_in_their_first_chunk(flood):
    first = counted(flood[:65536], 10_000)
    assert first.over
    with pytest.raises(InvalidInput, match="refused before it was parsed"):
        first.check("the request body", "model m")


def test_only_the_json_part_of_a_binary_body_is_counted():
    head = json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1],
                                   "parameters": {"binary_data_size": 100_000}}]}).encode()
    body = head + b'",:' * 33_334
    assert not counted(body, 100, cuts=[10, 4096], json_bytes=len(head)).over
    assert counted(body, 100, cuts=[10, 4096]).over


def test_utf16_is_counted_as_its_utf8():
    body = json.dumps(["\u2222,"] * 50).encode("utf-16")  # U+2222 is the bytes 22 22: two quotes
    assert json.loads(body) == ["\u2222,"] * 50
    count = counted(body, 60)
    count.recount(body)
    assert not count.over and count.values == 50
    count = counted(body, 40)
    count.recount(body)
    assert count.over


# ---- the longest string, bounded from below --------------------------------------------------

def strings_of(obj):
    """Every string of a parsed JSON text, keys included."""
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, list):
        for v in obj:
            yield from strings_of(v)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from strings_of(v)


def longest_utf8(obj) -> int:
    return max((len(s.encode("utf-8", "surrogatepass")) for s in strings_of(obj)), default=0)


@pytest.mark.parametrize("dumps", [
    lambda o: json.dumps(o).encode(),
    lambda o: json.dumps(o, ensure_ascii=False).encode(),
], ids=["ascii", "utf8"])
def test_no_string_within_the_bound_is_refused_wherever_the_chunks_end(dumps, monkeypatch):
    """The bound is a lower bound of each string's UTF-8 (escapes, \\uXXXX included): a body whose
    longest string is L bytes is never refused at L, and one without escapes is refused at L - 1; nor
    is one whose strings are T bytes in all refused at T."""
    monkeypatch.setattr(json_values, "LARGE", 0)  # every length refused past its bound, not only large ones
    rng = random.Random(11)
    for _ in range(2000):
        obj = random_json(rng)
        body = dumps(obj)
        cuts = [rng.randrange(len(body) + 1) for _ in range(rng.randrange(6))]
        longest, total = longest_utf8(obj), sum(len(t.encode("utf-8", "surrogatepass")) for t in strings_of(obj))
        assert not counted(body, cuts=cuts, longest=longest, total=total).over, (body, cuts)
        if longest and b"\\" not in body:
            assert counted(body, cuts=cuts, longest=longest - 1).too_long == longest, (body, cuts)


def test_a_long_string_is_refused_in_the_chunk_that_proves_it():
    """A 4 MB string against a bound of 64 KiB (512 tokens of at most 128 bytes): refused once it
    has passed LARGE, not after it has arrived, and strings up to LARGE are left to the signature."""
    body = json.dumps({"inputs": [{"name": "TEXT", "data": ["a" * (4 << 20)]}]}).encode()
    count = ValueCount(1000, longest=512 * 128)
    for start in range(0, len(body), 65536):
        count.feed(body[start:start + 65536])
        if count.final:
            break
    assert count.too_long and start < json_values.LARGE + 65536, start
    with pytest.raises(InvalidInput, match="a string of at least .* bytes, longer than any text a request to "
                                           "model m can hold .65536 bytes.*refused before it was parsed"):
        count.check("the request body", "model m")
    assert not counted(json.dumps(["a" * json_values.LARGE]).encode(), 1000, longest=100).over
    escaped = json.dumps(["\u00e9" * (json_values.LARGE + 1)]).encode()  # 6 JSON bytes a character, 2 of UTF-8:
    assert counted(escaped, 1000, longest=100, cuts=range(0, len(escaped), 4096)).too_long  # counted 1


def test_utf16_strings_are_measured_as_their_utf8():
    body = json.dumps(["x" * 300_000]).encode("utf-16")  # 600 kB of UTF-16, 300 kB of UTF-8
    count = counted(body, 100, longest=1000)
    assert not count.final  # UTF-16: not known until recounted
    count.recount(body)
    assert count.too_long == 300_000


def test_strings_are_held_to_the_texts_total_plus_large():
    """Many strings each under LARGE hold no more than a request's texts can, plus LARGE of names and
    parameters: 16 strings of 250 kB against a total of 1 MiB are refused, 4 are not."""
    within = json.dumps(["b" * 250_000] * 4).encode()
    assert not counted(within, 1000, cuts=range(0, len(within), 65536), longest=65536, total=1 << 20).over
    flood = json.dumps(["b" * 250_000] * 16).encode()
    count = counted(flood, 1000, cuts=range(0, len(flood), 65536), longest=65536, total=1 << 20)
    assert count.too_much > (1 << 20) + json_values.LARGE and not count.too_long
    with pytest.raises(InvalidInput, match="bytes of strings, more than the texts of a request to model m"):
        count.check("the request body", "model m")
    newlines = json.dumps(["\n" * 1000] * 2000).encode()  # escaped: 2 JSON bytes, 1 of UTF-8, counted -3
    assert not counted(newlines, 10_000, longest=65536, total=1000).over
    backslashes = json.dumps(["\\n" * 1000] * 2000).encode()  # an escaped backslash and n: 2 of UTF-8, counted 1
    assert counted(backslashes, 10_000, longest=65536, total=1000).too_much


def test_bytes_outside_strings_are_held_to_what_the_budget_can_take():
    """300 dimensions of 4,000 digits are 300 values, within any budget, but 1.2 MB that json.loads
    takes ~20 ms over: refused by their bytes outside strings (OUTSIDE_PER_VALUE a budgeted value)
    long before the body ends. A body at its budget of the longest numbers, indented, passes."""
    budget = 5000
    dims = ('{"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [%s], "data": ["a"]}]}'
            % ", ".join(["1" + "0" * 4000] * 300)).encode()
    count = counted(dims, budget, cuts=range(0, len(dims), 65536))
    assert count.over and count.too_wide
    assert count.too_wide <= json_values.OUTSIDE_PER_VALUE * budget + json_values.OUTSIDE_BASE + 65536
    with pytest.raises(InvalidInput, match="bytes outside strings .* refused before it was parsed"):
        count.check("the request body", "model m")
    ids = {"inputs": [{"name": "INPUT_IDS", "datatype": "INT64", "shape": [budget - 20],
                       "data": [-(2 ** 63)] * (budget - 20)}], "parameters": {"timeout": 2 ** 63 - 1}}
    body = json.dumps(ids, indent=8).encode()
    assert not counted(body, budget, cuts=range(0, len(body), 4096)).over
