"""Hostile RLDS / TFRecord sources: records, protobuf bytes and TFDS metadata written to hurt the reader.

Each attack class has its test: parsing time (long varints, many fields, packed and unpacked
values: linear, a varint past 10 bytes or 2^64 named), size (20M unpacked floats parsed as arrays,
length claims refused before allocating, ``bounds.MAX_VALUES``), types (hostile ``features.json``,
text mapped as numbers, shapes that disagree with the values), files the source names (links to
``/etc/passwd``, ``/proc/self/environ``, FIFOs: refused unopened) and per-episode failures (named,
skippable, the good episodes' rows exact). Records are written by hand here, byte by byte, from
the protobuf wire format; ``tfrecord.example_pb2`` (Google's protobuf runtime) is the oracle for
what they hold. The heavy cases run in a child process under a 3 GiB address-space limit
(``RLIMIT_AS``) and a timeout.
"""

from __future__ import annotations

import json
import os
import resource
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
from fifowatch import FifoWatch
from sourcecheck import column, read_back

from epishard.cli import main
from epishard.shardwriter import ConversionError, ConvertOptions, convert
from epishard.shardwriter.errors import SourceError
from epishard.shardwriter.sources import Mapping, SourceOptions, bounds
from epishard.shardwriter.sources import rlds as rlds_module
from epishard.shardwriter.sources.tfrecord import RecordError, masked_crc, parse_example

example_pb2 = pytest.importorskip("tfrecord.example_pb2")

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
LIMIT = 3 << 30  # the child's address space
TFDS = "tensorflow_datasets.core.features."


# --- the protobuf wire format, by hand: a key is the varint (field number << 3 | wire type);
# wire 0 a varint, 1 eight bytes, 2 a varint length and that many bytes, 5 four bytes.


def varint(n: int) -> bytes:
    """Base-128 varint, low groups first; a negative int64 as its 64-bit two's complement (10 bytes)."""
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def key(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def ld(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return key(number, 2) + varint(len(payload)) + payload


def float_list(values, packed: bool = True) -> bytes:
    """A ``Feature`` holding a ``FloatList`` (field 2)."""
    data = np.asarray(values, "<f4")
    body = ld(1, data.tobytes()) if packed else b"".join(key(1, 5) + v.tobytes() for v in data)
    return ld(2, body)


def int_list(values, packed: bool = True) -> bytes:
    """A ``Feature`` holding an ``Int64List`` (field 3)."""
    if packed:
        body = ld(1, b"".join(varint(int(v)) for v in values))
    else:
        body = b"".join(key(1, 0) + varint(int(v)) for v in values)
    return ld(3, body)


def bytes_list(values) -> bytes:
    """A ``Feature`` holding a ``BytesList`` (field 1)."""
    return ld(1, b"".join(ld(1, v) for v in values))


def example(features: dict[str, bytes]) -> bytes:
    """``Example { Features features = 1 { map<string, Feature> feature = 1 } }`` from name -> Feature bytes."""
    entries = b"".join(ld(1, ld(1, name.encode()) + ld(2, feature)) for name, feature in features.items())
    return ld(1, entries)


def record(data: bytes, length: int | None = None) -> bytes:
    """A TFRecord record: length, its masked CRC-32C, data, its masked CRC-32C (``length`` may lie)."""
    header = struct.pack("<Q", len(data) if length is None else length)
    return header + struct.pack("<I", masked_crc(header)) + data + struct.pack("<I", masked_crc(data))


def state(e: int, t: int) -> np.ndarray:
    return (np.arange(t * 4, dtype=np.float32).reshape(t, 4) / 4 + e).astype(np.float32)


def action(e: int, t: int) -> np.ndarray:
    return (-np.arange(t * 2, dtype=np.float32).reshape(t, 2) / 8 - e).astype(np.float32)


def episode(e: int, t: int, packed: bool = True) -> dict[str, bytes]:
    """An honest episode's features: state [4], action [2], flags, a language instruction."""
    return {
        "steps/observation/state": float_list(state(e, t).ravel(), packed),
        "steps/action": float_list(action(e, t).ravel(), packed),
        "steps/is_first": int_list([int(i == 0) for i in range(t)], packed),
        "steps/is_last": int_list([int(i == t - 1) for i in range(t)], packed),
        "steps/language_instruction": bytes_list([f"task {e}".encode()] * t),
    }


def _tensor(shape, dtype="float32", encoding="none") -> dict:
    return {
        "pythonClassName": TFDS + "tensor_feature.Tensor",
        "tensor": {"shape": {"dimensions": [str(d) for d in shape]}, "dtype": dtype, "encoding": encoding},
    }


def features_json(extra: dict | None = None) -> dict:
    """A TFDS ``features.json`` for ``episode`` (plus ``extra`` per-step features)."""
    scalar = {"pythonClassName": TFDS + "scalar.Scalar", "tensor": {"shape": {}, "dtype": "bool"}}
    step = {
        "observation": {"featuresDict": {"features": {"state": _tensor([4])}}},
        "action": _tensor([2]),
        "is_first": scalar,
        "is_last": scalar,
        "language_instruction": {"pythonClassName": TFDS + "text_feature.Text", "text": {}},
        **(extra or {}),
    }
    return {
        "featuresDict": {
            "features": {
                "steps": {"sequence": {"feature": {"featuresDict": {"features": step}}, "length": "-1"}},
            }
        }
    }


def write_source(
    root, records: list[bytes], spec: dict | str | None = "default", name="toy-train.tfrecord-00000-of-00001"
):
    """A TFDS folder: ``features.json`` (``spec``; None: none) and one TFRecord file of ``records``."""
    os.makedirs(root, exist_ok=True)
    if spec is not None:
        text = json.dumps(features_json()) if spec == "default" else spec if isinstance(spec, str) else json.dumps(spec)
        with open(os.path.join(root, "features.json"), "w") as f:
            f.write(text)
    with open(os.path.join(root, name), "wb") as f:
        f.write(b"".join(records))
    return str(root)


def _options(**kw) -> ConvertOptions:
    sources = kw.pop("sources", None)
    return ConvertOptions(progress=False, sources=sources, **kw)


def _check_rows(out: str, expected: dict[int, tuple[int, int]]) -> None:
    """Episode index -> (e, t): the converted rows are exactly ``episode(e, t)``'s."""
    back = read_back(out)
    assert sorted(i for _, i in back) == sorted(expected)
    for index, (e, t) in expected.items():
        ep = back[("toy", index)]
        assert np.array_equal(column(ep["table"], "observation.state"), state(e, t))
        assert np.array_equal(column(ep["table"], "action"), action(e, t))
        assert ep["table"].column("language_instruction").to_pylist() == [f"task {e}"] * t
        assert ep["tasks"] == [f"task {e}"]


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err
    assert "unexpected" not in err and "Traceback" not in err, err
    return code, err


# --- child processes: RLIMIT_AS and a timeout

_CHILD = r"""
import json, resource, sys
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import test_hostile_rlds as t
try:
    result = getattr(t, sys.argv[2])(*json.loads(sys.argv[3]))
except BaseException as exc:
    result = {"error": f"{type(exc).__name__}: {exc}"[:600]}
print("RESULT " + json.dumps(result))
"""


def _own_peak_mib() -> float:
    """This process's own peak resident memory, MiB: ``VmHWM`` of its address space.

    Not ``ru_maxrss``, which Linux carries across ``fork`` and ``exec``: a child started from a large
    pytest process would report the parent's size.
    """
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _in_child(name: str, *args, timeout: float = 90) -> dict:
    """``name(*args)`` of this module run in a child under ``LIMIT`` bytes of address space."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, REPO])}
    argv = [sys.executable, "-c", _CHILD, str(LIMIT), name, json.dumps(args)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name}: did not finish in {timeout} s")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def _parse_outcome(data: bytes) -> tuple[float, dict]:
    t0 = time.perf_counter()
    try:
        parsed = parse_example(data)
        outcome = {
            k: [kind, len(v), float(np.asarray(v, np.float64).sum()) if kind != "bytes" else 0.0]
            for k, (kind, v) in parsed.items()
        }
    except RecordError as exc:
        outcome = {"error": str(exc), "kind": getattr(exc, "kind", None)}
    return time.perf_counter() - t0, outcome


def _shape(name: str, n: int) -> bytes:
    """About ``n`` bytes of one hostile (or merely big) shape of ``tf.train.Example``."""
    if name == "long_varint":  # one int64 value written in n bytes (a varint has at most 10)
        return example({"steps/x": ld(3, ld(1, b"\xff" * (n - 1) + b"\x01"))})
    if name == "long_varint_key":  # a field key of n bytes
        return example({"steps/x": float_list([1.0])}) + b"\xff" * (n - 1) + b"\x01"
    if name == "unknown_fields":  # n/2 fields this reader does not know: skipped one by one
        return example({"steps/x": float_list([1.0])}) + b"\x10\x01" * (n // 2)
    if name == "packed_ints":  # 10-byte varints (-1)
        return example({"steps/x": ld(3, ld(1, (b"\xff" * 9 + b"\x01") * (n // 10)))})
    if name == "unpacked_ints":
        return example({"steps/x": ld(3, b"\x08\x05" * (n // 2))})
    if name == "unpacked_floats":
        return example({"steps/x": ld(2, (b"\x0d" + struct.pack("<f", 1.5)) * (n // 5))})
    if name == "mixed_floats":  # a packed field of one value, an unpacked value, ... (legal, never written)
        return example(
            {"steps/x": ld(2, (b"\x0a\x04" + struct.pack("<f", 1.5) + b"\x0d" + struct.pack("<f", 2.0)) * (n // 11))}
        )
    if name == "mixed_ints":
        return example({"steps/x": ld(3, b"\x0a\x01\x05\x08\x07" * (n // 5))})
    if name == "bytes_entries":
        return example({"steps/x": ld(1, b"\x0a\x02ab" * (n // 4))})
    raise ValueError(name)


SHAPES = (
    "long_varint",
    "long_varint_key",
    "unknown_fields",
    "packed_ints",
    "unpacked_ints",
    "unpacked_floats",
    "mixed_floats",
    "mixed_ints",
    "bytes_entries",
)


def _child_timing(shapes: list[str]) -> dict:
    """Per shape: the best of two parse times of 1 MB and of 4 MB, and the 1 MB outcome."""
    out = {}
    for name in shapes:
        times, outcome = [], None
        for n in (1 << 20, 4 << 20):
            data = _shape(name, n)
            best = None
            for _ in range(2):
                seconds, outcome_n = _parse_outcome(data)
                best = seconds if best is None else min(best, seconds)
            times.append(best)
            outcome = outcome if outcome is not None else outcome_n
        out[name] = {"t1": times[0], "t4": times[1], "outcome": outcome}
    return out


def _child_big_unpacked(count: int) -> dict:
    """``count`` unpacked floats (each its own field, 5 bytes) and ``count`` unpacked ints (2 bytes)
    parsed; the bytes the parser allocated at its peak (``tracemalloc``: numpy and Python alike)."""
    import tracemalloc

    values = np.arange(count, dtype=np.float32)
    body = np.empty((count, 5), np.uint8)
    body[:, 0] = 0x0D
    body[:, 1:] = values.view(np.uint8).reshape(count, 4)
    data = example({"steps/f": ld(2, body.tobytes())})
    del body
    ints = example({"steps/i": ld(3, b"\x08\x07" * count)})
    out = {"record_mib": len(data) / 2**20}
    tracemalloc.start()
    t0 = time.perf_counter()
    kind, got = parse_example(data)["steps/f"]
    out["float_parse_peak_mib"] = tracemalloc.get_traced_memory()[1] / 2**20
    out["floats_ok"] = kind == "float" and bool(np.array_equal(got, values))
    del got
    tracemalloc.reset_peak()
    kind, got = parse_example(ints)["steps/i"]
    out["int_parse_peak_mib"] = tracemalloc.get_traced_memory()[1] / 2**20
    out["ints_ok"] = kind == "int64" and len(got) == count and bool((np.asarray(got) == 7).all())
    out["seconds"] = time.perf_counter() - t0
    tracemalloc.stop()
    out["peak_mib"] = _own_peak_mib()
    return out


def _child_convert(cases: dict[str, str], out: str) -> dict:
    """``convert`` (``--on-error skip``) of each case's source in the child: totals and skips, or
    the error's kind and text; the child's peak memory."""
    results = {}
    for name, src in cases.items():
        try:
            manifest = convert([src], os.path.join(out, name), ConvertOptions(progress=False, on_error="skip"))
        except (ConversionError, SourceError) as exc:
            results[name] = {"error": type(exc).__name__, "kind": getattr(exc, "kind", None), "text": str(exc)[:600]}
            continue
        results[name] = {
            "episodes": manifest.totals.episodes,
            "skipped": dict(manifest.report.skipped_by_kind),
            "messages": [s.message for s in manifest.report.skipped],
        }
    results["peak_mib"] = _own_peak_mib()
    return results


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> dict:
    """Hostile sources converted in one child under ``LIMIT`` and a timeout: case -> outcome."""
    base = tmp_path_factory.mktemp("hostile_rlds")
    good = [record(example(episode(e, 3))) for e in range(3)]
    sources = {
        # record 1's header claims 2^62 bytes (its CRC matches): more than the file holds
        "past_file": [good[0], record(example(episode(1, 3)), length=1 << 62)],
        # a 1 MB varint as the first record (the one the default mapping is read from)
        "first_record_varint": [
            record(example({**episode(9, 3), "steps/action": ld(3, ld(1, b"\xff" * (1 << 20) + b"\x01"))})),
            good[1],
        ],
    }
    # a packed float list, a bytes value, an int list whose length runs past the record
    for n, feature in enumerate(
        (
            ld(2, key(1, 2) + varint(1 << 40)),
            ld(1, key(1, 2) + varint(1 << 33) + b"ab"),
            ld(3, key(1, 2) + varint(50) + b"\x01"),
        )
    ):
        sources[f"past_record_{n}"] = [good[0], record(example({**episode(1, 3), "steps/action": feature})), good[2]]
    cases = {name: write_source(base / name / "toy", records) for name, records in sources.items()}
    return _in_child("_child_convert", cases, str(base / "out"), timeout=120)


# --- the oracle: our parser against Google's protobuf runtime


def test_parser_agrees_with_protobuf_on_packed_unpacked_and_merged_fields():
    ints = [0, 1, -1, 127, 128, 2**63 - 1, -(2**63), 300, -300]
    floats = [0.0, -1.5, 3.25e-3, np.inf, 1e30]
    features = {
        "packed_f": float_list(floats),
        "unpacked_f": float_list(floats, packed=False),
        # a packed field, an unpacked value and another packed field: protobuf concatenates them
        "mixed_f": ld(
            2,
            ld(1, np.float32([1, 2]).tobytes())
            + key(1, 5)
            + np.float32(3).tobytes()
            + ld(1, np.float32([4]).tobytes()),
        ),
        "packed_i": int_list(ints),
        "unpacked_i": int_list(ints, packed=False),
        "mixed_i": ld(3, key(1, 0) + varint(5) + ld(1, varint(6) + varint(-7)) + key(1, 0) + varint(2**40)),
        "bytes": bytes_list([b"", b"a", b"\x00\xff" * 300]),
        "empty_f": ld(2, b""),
        "empty": b"",
        "unknown_field_skipped": ld(
            2, key(7, 0) + varint(99) + ld(1, np.float32([8]).tobytes()) + key(9, 1) + b"12345678"
        ),
    }
    data = example(features) + key(5, 0) + varint(1)  # an unknown top-level field too
    oracle = example_pb2.Example.FromString(data).features.feature
    ours = parse_example(data)
    assert set(ours) == set(oracle)
    for name, feature in oracle.items():
        which = feature.WhichOneof("kind")
        kind, values = ours[name]
        if which == "float_list":
            assert kind == "float" and np.asarray(values).dtype == np.float32
            assert np.array_equal(np.asarray(values), np.float32(list(feature.float_list.value))), name
        elif which == "int64_list":
            assert kind == "int64" and np.asarray(values).dtype == np.int64
            assert np.asarray(values).tolist() == list(feature.int64_list.value), name
        elif which == "bytes_list":
            assert kind == "bytes" and list(values) == list(feature.bytes_list.value), name
        else:  # no list: nothing
            assert len(values) == 0, name
    assert ours["packed_i"][1].tolist() == ints and ours["mixed_i"][1].tolist() == [5, 6, -7, 2**40]


# --- 1. time: linear parsing, long varints named


@pytest.mark.parametrize(
    "data, what, named",
    [
        (example({"steps/x": ld(3, ld(1, b"\xff" * 10 + b"\x01"))}), "longer than 10 bytes", True),  # 11 bytes
        (example({"steps/x": ld(3, ld(1, b"\xff" * 9 + b"\x02"))}), r"2\^64", True),  # 10 bytes, >= 2^64
        (example({"steps/x": ld(3, key(1, 0) + b"\xff" * 9 + b"\x7f")}), r"2\^64", True),  # unpacked
        (example({"steps/x": ld(3, key(1, 0) + b"\x80" * 30 + b"\x00")}), "longer than 10 bytes", True),
        (example({"steps/x": ld(2, ld(1, b"\x00" * 6))}), "multiple of 4", True),  # packed floats of 6 bytes
        (ld(1, b"") + b"\x0a" + b"\xff" * 20 + b"\x01", "longer than 10 bytes", False),  # a length prefix
        (b"\xff" * 40 + b"\x01", "longer than 10 bytes", False),  # a key
    ],
    ids=["11_bytes", "packed_2^64", "unpacked_2^64", "zeros_31_bytes", "floats_6_bytes", "length", "key"],
)
def test_malformed_varints_and_lists_are_named(data, what, named):
    with pytest.raises(RecordError, match=what) as err:
        parse_example(data)
    assert getattr(err.value, "kind", None) == "unreadable_file"
    assert ("steps/x" in str(err.value)) == named  # the feature, where there is one


def test_parsing_is_linear_for_every_shape():
    """1 MB and 4 MB of each shape: 1 MB well under a second or two, 4 MB about 4 times 1 MB (a
    quadratic parser takes 16 times as long, and took 51 s on a 1 MB varint)."""
    result = _in_child("_child_timing", list(SHAPES), timeout=120)
    assert "error" not in result, result
    for name in SHAPES:
        r = result[name]
        assert r["t1"] < 3.0, (name, r)
        assert r["t4"] <= 8 * max(r["t1"], 0.05), (name, r)
    # the outcomes: long varints named, the rest parsed to every value
    assert "longer than 10 bytes" in result["long_varint"]["outcome"]["error"]
    assert "steps/x" in result["long_varint"]["outcome"]["error"]
    assert "longer than 10 bytes" in result["long_varint_key"]["outcome"]["error"]
    n = 1 << 20
    assert result["unpacked_floats"]["outcome"]["steps/x"] == ["float", n // 5, 1.5 * (n // 5)]
    assert result["unpacked_ints"]["outcome"]["steps/x"] == ["int64", n // 2, 5.0 * (n // 2)]
    assert result["packed_ints"]["outcome"]["steps/x"] == ["int64", n // 10, -1.0 * (n // 10)]
    assert result["mixed_floats"]["outcome"]["steps/x"] == ["float", 2 * (n // 11), 3.5 * (n // 11)]
    assert result["mixed_ints"]["outcome"]["steps/x"] == ["int64", 2 * (n // 5), 12.0 * (n // 5)]
    assert result["bytes_entries"]["outcome"]["steps/x"][:2] == ["bytes", n // 4]
    assert result["unknown_fields"]["outcome"]["steps/x"] == ["float", 1, 1.0]


# --- 2. size


def test_twenty_million_unpacked_floats_are_arrays_not_objects():
    result = _in_child("_child_big_unpacked", 20_000_000, timeout=120)
    assert "error" not in result, result
    assert result["floats_ok"] and result["ints_ok"], result
    assert result["seconds"] < 20, result
    # the values themselves are 80 MB (float32) and 160 MB (int64); 20M Python objects would be
    # >= 2 GB (a numpy array each) or 640 MB (floats in a list)
    assert result["float_parse_peak_mib"] < 2.5 * 80, result
    assert result["int_parse_peak_mib"] < 1.6 * 160, result
    assert result["peak_mib"] < 1200, result  # the whole child, building the records included


def test_values_beyond_max_values_are_refused(monkeypatch):
    monkeypatch.setattr(bounds, "MAX_VALUES", 1000)
    for feature in (
        float_list(np.zeros(1001)),
        float_list(np.zeros(1001), packed=False),
        int_list([1] * 1001),
        int_list([1] * 1001, packed=False),
        bytes_list([b"x"] * 1001),
    ):
        with pytest.raises(RecordError, match="steps/big") as err:
            parse_example(example({"steps/big": feature}))
        assert err.value.kind == "too_large" and "1001" in str(err.value)
    assert len(parse_example(example({"steps/big": float_list(np.zeros(1000), packed=False)}))["steps/big"][1]) == 1000


def test_counts_beyond_the_limits_are_refused(tmp_path, monkeypatch):
    from epishard.shardwriter.sources import tfrecord

    src = write_source(tmp_path / "toy", [record(example(episode(e, 3 + e))) for e in range(3)])
    monkeypatch.setattr(bounds, "MAX_EPISODES", 2)
    with pytest.raises(SourceError, match="MAX_EPISODES"):
        convert([src], str(tmp_path / "o1"), _options())
    monkeypatch.setattr(bounds, "MAX_EPISODES", 3)
    monkeypatch.setattr(bounds, "MAX_ROWS", 4)  # episode 2 has 5 steps
    manifest = convert([src], str(tmp_path / "o2"), _options(on_error="skip"))
    assert manifest.report.skipped_by_kind == {"too_large": 1} and manifest.report.skipped[0].episode == 2
    assert "steps/is_first" in manifest.report.skipped[0].message
    _check_rows(str(tmp_path / "o2"), {0: (0, 3), 1: (1, 4)})
    monkeypatch.setattr(tfrecord, "MAX_FEATURES", 4)  # an episode has 5
    with pytest.raises(RecordError, match="MAX_FEATURES") as err:
        parse_example(example(episode(0, 3)))
    assert err.value.kind == "too_large"


def test_lengths_past_the_record_or_the_file_are_refused_before_allocating(converted):
    result = converted["past_file"]
    assert result["episodes"] == 1 and result["skipped"] == {"unreadable_file": 1}, result
    assert "truncated" in result["messages"][0] and "record 1" in result["messages"][0]
    for n in range(3):
        result = converted[f"past_record_{n}"]
        assert result["episodes"] == 2 and result["skipped"] == {"unreadable_file": 1}, result
        assert "steps/action" in result["messages"][0] and "record 1" in result["messages"][0], result
        assert "runs past its message" in result["messages"][0], result
    assert converted["peak_mib"] < 2048, converted  # nothing of 2^62, 2^40 or 2^33 bytes asked for


def test_a_record_longer_than_max_record_bytes_is_refused_unread(tmp_path, monkeypatch):
    long = {**episode(1, 3), "steps/language_instruction": bytes_list([b"task 1" + b" " * 2000] * 3)}
    records = [record(example(episode(0, 3))), record(example(long)), record(example(episode(2, 4)))]
    src = write_source(tmp_path / "toy", records)
    monkeypatch.setattr(bounds, "MAX_RECORD_BYTES", 2000)
    read, real = [], rlds_module.parse_example
    monkeypatch.setattr(
        rlds_module, "parse_example", lambda data, *a, **k: read.append(len(data)) or real(data, *a, **k)
    )
    manifest = convert([src], str(tmp_path / "out"), _options(on_error="skip"))
    assert manifest.report.skipped_by_kind == {"too_large": 1}
    skipped = manifest.report.skipped[0]
    assert skipped.episode == 1 and "record 1" in skipped.message and "tfrecord-00000" in skipped.file
    assert all(n < 2000 for n in read)
    _check_rows(str(tmp_path / "out"), {0: (0, 3), 2: (2, 4)})


# --- 3. types


DEEP = 100_000


@pytest.mark.parametrize(
    "spec, path",
    [
        ('{"featuresDict": {"features": ' * DEEP + "{}" + "}}" * DEEP, None),  # 200k levels
        ({"featuresDict": []}, "featuresDict"),
        ({"featuresDict": {"features": "steps"}}, "featuresDict.features"),
        ({"featuresDict": {"features": {"steps": {"sequence": []}}}}, "featuresDict.features.steps.sequence"),
        (features_json({"joints": {"tensor": {"shape": {"dimensions": ["x"]}, "dtype": "float32"}}}), "joints"),
        (features_json({"joints": {"tensor": {"shape": {"dimensions": {"a": 1}}, "dtype": "float32"}}}), "joints"),
        (features_json({"joints": {"tensor": {"shape": {"dimensions": ["-5"]}, "dtype": "float32"}}}), "joints"),
        (features_json({"joints": {"tensor": {"shape": {"dimensions": ["2"]}, "dtype": ["float32"]}}}), "joints"),
        (features_json({"joints": {"tensor": {"shape": {"dimensions": ["2"]}, "dtype": 5}}}), "joints"),
        (features_json({"joints": {"tensor": []}}), "joints"),
        (features_json({"joints": "tensor"}), "joints"),
        ("[1, 2", None),
        ('"a string"', ""),
    ],
)
def test_hostile_features_json_is_refused_naming_the_file_and_the_entry(tmp_path, capsys, spec, path):
    src = write_source(tmp_path / "toy", [record(example(episode(0, 3)))], spec=spec)
    with pytest.raises(SourceError) as err:
        convert([src], str(tmp_path / "o"), _options())
    text = str(err.value)
    assert "features.json" in text, text
    if path:
        assert path in text, text
    code, line = _cli(["convert", src, str(tmp_path / "o2"), "-q"], capsys)
    assert code == 2 and "features.json" in line


@pytest.mark.parametrize("with_features", [True, False])
@pytest.mark.parametrize("field", ["state", "action", "columns"])
def test_text_mapped_as_numbers_is_refused_at_open(tmp_path, capsys, with_features, field):
    src = write_source(tmp_path / "toy", [record(example(episode(0, 3)))], spec="default" if with_features else None)
    mapping = (
        {"columns": {"observation.words": "language_instruction"}}
        if field == "columns"
        else {field: ["language_instruction"]}
    )
    with pytest.raises(ConversionError) as err:
        rlds_module.open_rlds(src, SourceOptions(mapping=Mapping.from_dict(mapping)), None, None, None)
    e = err.value
    assert e.kind == "bad_feature" and "steps/language_instruction" in e.detail, e
    assert ("features.json" if with_features else "tfrecord-00000") in e.path
    (tmp_path / "m.json").write_text(json.dumps(mapping))
    code, line = _cli(["convert", src, str(tmp_path / "o"), "--mapping", str(tmp_path / "m.json"), "-q"], capsys)
    assert code == 2 and "[bad_feature]" in line and "steps/language_instruction" in line


def test_a_tensor_of_another_dtype_is_kept_out_or_refused_when_mapped(tmp_path):
    spec = features_json({"joints": _tensor([2], "complex64")})
    joints = bytes_list([np.complex64([1, 2]).tobytes()] * 3)
    src = write_source(tmp_path / "toy", [record(example({**episode(0, 3), "steps/joints": joints}))], spec=spec)
    manifest = convert([src], str(tmp_path / "o1"), _options())
    assert "steps/joints (unsupported) is not kept" in manifest.sources[0].notes
    _check_rows(str(tmp_path / "o1"), {0: (0, 3)})
    mapped = SourceOptions(mapping=Mapping.from_dict({"action": ["joints"]}))
    with pytest.raises(ConversionError) as err:
        convert([src], str(tmp_path / "o2"), _options(sources=mapped))
    assert err.value.kind == "bad_feature" and "steps/joints" in err.value.detail and "complex64" in err.value.detail
    assert err.value.path.endswith("features.json")


def test_declared_shapes_that_disagree_with_the_values_are_named(tmp_path):
    # a tensor stored as its bytes (TFDS encoding "bytes"): [3] float32 = 12 bytes per step
    extra = {"joints": _tensor([3], "float32", "bytes"), "cam": _tensor([4, 4, 3], "uint8")}
    spec = features_json(extra)
    cam = bytes_list([bytes(48)] * 3)

    def joints(sizes):
        return bytes_list([np.arange(n, dtype=np.float32).tobytes() for n in sizes])

    good = {**episode(0, 3), "steps/joints": joints([3, 3, 3]), "steps/cam": cam}
    src = write_source(tmp_path / "ok" / "toy", [record(example(good))], spec=spec)
    manifest = convert([src], str(tmp_path / "o0"), _options())
    assert manifest.totals.episodes == 1
    back = read_back(str(tmp_path / "o0"))[("toy", 0)]
    assert np.array_equal(column(back["table"], "joints"), np.tile(np.arange(3, dtype=np.float32), (3, 1)))
    cases = {
        "bytes_short": ({**good, "steps/joints": joints([3, 2, 3])}, "length_mismatch", "steps/joints"),
        "bytes_odd": (
            {**good, "steps/joints": bytes_list([bytes(12), bytes(13), bytes(12)])},
            "length_mismatch",
            "steps/joints",
        ),
        "count": ({**good, "steps/action": float_list(np.zeros(5))}, "length_mismatch", "steps/action"),
        "camera": ({**good, "steps/cam": bytes_list([bytes(48), bytes(47), bytes(48)])}, None, "steps/cam"),
        "flags_text": ({**good, "steps/is_last": bytes_list([b"a", b"b", b"c"])}, "bad_feature", "steps/is_last"),
    }
    for name, (bad, kind, key_) in cases.items():
        src = write_source(tmp_path / name / "toy", [record(example(bad))], spec=spec)
        with pytest.raises(ConversionError) as err:
            convert([src], str(tmp_path / f"o_{name}"), _options())
        e = err.value
        assert e.kind != "internal" and (kind is None or e.kind == kind), (name, e)
        assert key_ in str(e) and e.episode == 0 and "tfrecord-00000" in e.path, (name, e)


def test_a_camera_tensor_claiming_a_huge_frame_is_refused_at_open(tmp_path):
    spec = features_json({"cam": _tensor([100000, 100000, 3], "uint8")})
    src = write_source(
        tmp_path / "toy", [record(example({**episode(0, 3), "steps/cam": bytes_list([b"x"] * 3)}))], spec=spec
    )
    with pytest.raises((SourceError, ConversionError), match="steps/cam") as err:
        convert([src], str(tmp_path / "o"), _options())
    assert "too_large" in str(err.value) or "more than" in str(err.value)


# --- 4. files the source names


@pytest.mark.parametrize("allow", [False, True])
@pytest.mark.parametrize("target", ["/etc/passwd", "/proc/self/environ", "fifo"])
@pytest.mark.parametrize("which", ["features.json", "toy-train.tfrecord-00001-of-00002"])
def test_links_and_fifos_are_refused_unread(tmp_path, capsys, allow, target, which):
    src = write_source(tmp_path / "toy", [record(example(episode(0, 3)))], name="toy-train.tfrecord-00000-of-00002")
    link = os.path.join(src, which)
    if os.path.exists(link):
        os.remove(link)
    watch = None
    if target == "fifo":
        watch = FifoWatch(str(tmp_path / "fifo"))
        target = watch.path
    os.symlink(target, link)
    if allow and target == "/etc/passwd" and which.endswith("00002"):
        # --allow-external: a regular file outside is the user's to read; it is no TFRecord file
        with pytest.raises(ConversionError, match="not a TFRecord file") as err:
            convert([src], str(tmp_path / "o"), _options(sources=SourceOptions(allow_external=True)))
        assert err.value.kind == "unreadable_file" and "root:" not in str(err.value)
        return
    try:
        with pytest.raises(SourceError) as err:
            convert([src], str(tmp_path / "o"), _options(sources=SourceOptions(allow_external=allow)))
        text = str(err.value)  # names the file and where it leads (/proc/self is this process's number)
        assert which in text and (target in text or (target == "/proc/self/environ" and "/environ" in text)), text
        flag = ["--allow-external"] if allow else []
        code, line = _cli(["convert", src, str(tmp_path / "o2"), "-q", *flag], capsys)
        assert code == 2 and which in line
    finally:
        opened = watch.stop() if watch else False
    assert not opened


def test_a_fifo_in_the_folder_is_refused_unopened(tmp_path):
    src = write_source(tmp_path / "toy", [record(example(episode(0, 3)))], name="toy-train.tfrecord-00000-of-00002")
    watch = FifoWatch(os.path.join(src, "toy-train.tfrecord-00001-of-00002"))
    try:
        with pytest.raises(SourceError, match="FIFO"):
            convert([src], str(tmp_path / "o"), _options(sources=SourceOptions(allow_external=True)))
    finally:
        assert not watch.stop()


def test_allow_external_reads_linked_records_but_never_linked_metadata(tmp_path):
    outside = write_source(tmp_path / "elsewhere", [record(example(episode(1, 4)))], spec=None, name="x.tfrecord")
    src = write_source(tmp_path / "toy", [record(example(episode(0, 3)))], name="toy-train.tfrecord-00000-of-00002")
    os.symlink(os.path.join(outside, "x.tfrecord"), os.path.join(src, "toy-train.tfrecord-00001-of-00002"))
    with pytest.raises(SourceError, match="outside the source"):
        convert([src], str(tmp_path / "o1"), _options())
    manifest = convert([src], str(tmp_path / "o2"), _options(sources=SourceOptions(allow_external=True)))
    assert manifest.totals.episodes == 2
    _check_rows(str(tmp_path / "o2"), {0: (0, 3), 1: (1, 4)})
    # features.json linked out of the folder: refused even with --allow-external
    (tmp_path / "elsewhere" / "features.json").write_text(json.dumps(features_json()))
    os.remove(os.path.join(src, "features.json"))
    os.symlink(str(tmp_path / "elsewhere" / "features.json"), os.path.join(src, "features.json"))
    with pytest.raises(SourceError, match=r"features\.json.*outside the source"):
        convert([src], str(tmp_path / "o3"), _options(sources=SourceOptions(allow_external=True)))


# --- 5. every per-episode failure named and skippable


def _bad_records() -> dict[str, bytes]:
    """Records that each fail in a different way, by name."""
    crc = bytearray(record(example(episode(9, 3))))
    crc[30] ^= 0xFF
    return {
        "long_varint": record(example({**episode(9, 3), "steps/action": ld(3, ld(1, b"\xff" * 4000 + b"\x01"))})),
        "overflow": record(example({**episode(9, 3), "steps/is_first": ld(3, key(1, 0) + b"\xff" * 9 + b"\x03")})),
        "bad_crc": bytes(crc),
        "not_protobuf": record(b"\x0f" + b"\x00" * 40),  # wire type 7
        "bad_utf8_name": record(
            example({**episode(9, 3)}) + ld(1, ld(1, ld(1, b"\xff\xfe") + ld(2, float_list([1.0]))))
        ),
        "empty": record(b""),
        "group": record(example(episode(9, 3)) + key(3, 3) + key(3, 4)),
    }


def test_one_bad_record_among_good_ones_is_a_counted_skip(tmp_path, capsys):
    good = {0: (0, 3), 2: (2, 5), 4: (4, 4)}
    bad = _bad_records()
    for name, data in bad.items():
        records = [
            record(example(episode(0, 3))),
            data,
            record(example(episode(2, 5))),
            data,
            record(example(episode(4, 4))),
        ]
        src = write_source(tmp_path / name / "toy", records)
        with pytest.raises(ConversionError) as err:
            convert([src], str(tmp_path / name / "raise"), _options())
        e = err.value
        assert e.kind in ("unreadable_file", "missing_key") and e.episode == 1 and "tfrecord-00000" in e.path, (name, e)
        if e.kind == "unreadable_file":
            assert "record 1" in e.detail, (name, e)
        out = str(tmp_path / name / "skip")
        manifest = convert([src], out, _options(on_error="skip", workers=2, max_episodes_per_shard=2))
        assert manifest.totals.episodes == 3, name
        assert sum(manifest.report.skipped_by_kind.values()) == 2 and "internal" not in manifest.report.skipped_by_kind
        assert sorted(s.episode for s in manifest.report.skipped) == [1, 3]
        _check_rows(out, good)
    src = str(tmp_path / "long_varint" / "toy")
    code, line = _cli(["convert", src, str(tmp_path / "cli1"), "-q"], capsys)
    assert code == 2 and "[unreadable_file]" in line and "steps/action" in line and "varint" in line
    code, line = _cli(["convert", src, str(tmp_path / "cli2"), "-q", "--on-error", "skip"], capsys)
    assert code == 0


def test_a_hostile_first_record_does_not_stop_the_source_opening(converted):
    """A 1 MB varint as the first record (the one the mapping is read from) took the old parser
    more than 120 s; now it is named at its episode, and the next record gives the mapping."""
    result = converted["first_record_varint"]
    assert result["episodes"] == 1 and result["skipped"] == {"unreadable_file": 1}, result
    assert "varint" in result["messages"][0] and "steps/action" in result["messages"][0]


def test_crc_mismatches_are_named(tmp_path):
    good = [record(example(episode(e, 3))) for e in range(3)]
    data = bytearray(good[1])
    data[-1] ^= 0x01  # the data's CRC
    src = write_source(tmp_path / "toy", [good[0], bytes(data), good[2]])
    with pytest.raises(ConversionError, match="CRC does not match") as err:
        convert([src], str(tmp_path / "o1"), _options())
    assert (err.value.kind, err.value.episode) == ("unreadable_file", 1) and "record 1" in err.value.detail
    manifest = convert([src], str(tmp_path / "o2"), _options(on_error="skip"))
    assert manifest.report.skipped_by_kind == {"unreadable_file": 1}
    _check_rows(str(tmp_path / "o2"), {0: (0, 3), 2: (2, 3)})
    header = bytearray(good[1])
    header[9] ^= 0x01  # the length's CRC: the file cannot be framed past record 0
    src = write_source(tmp_path / "h" / "toy", [good[0], bytes(header), good[2]])
    manifest = convert([src], str(tmp_path / "o3"), _options(on_error="skip"))
    assert manifest.totals.episodes == 1 and manifest.report.skipped_by_kind == {"unreadable_file": 1}
    assert "length's CRC does not match" in manifest.report.skipped[0].message
