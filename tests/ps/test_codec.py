"""Wire-buffer checks: every bad length, dtype or dim is refused with InvalidArgument."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recstore.core import InvalidArgument, wire
from recstore.ps import codec


@pytest.mark.parametrize(
    ("nbytes", "ok"),
    [(0, True), (8, True), (80, True), (7, False), (9, False), (81, False)],
)
def test_decode_keys_needs_whole_int64s(nbytes: int, ok: bool) -> None:
    buffer = bytes(nbytes)
    if ok:
        assert codec.decode_keys(buffer).shape == (nbytes // 8,)
    else:
        with pytest.raises(InvalidArgument, match="whole number"):
            codec.decode_keys(buffer)


def test_decode_keys_is_little_endian_int64() -> None:
    keys = np.array([-1, 0, 2**62], dtype="<i8")
    np.testing.assert_array_equal(codec.decode_keys(keys.tobytes()), keys)


@pytest.mark.parametrize(
    ("dtype", "rows", "dim", "nbytes", "ok"),
    [
        ("float32", 3, 4, 48, True),
        ("float32", 3, 4, 47, False),
        ("float32", 3, 4, 24, False),  # float16-sized buffer for a float32 table
        ("float16", 3, 4, 24, True),
        ("bfloat16", 2, 8, 32, True),
        ("bfloat16", 2, 8, 64, False),
        ("float32", 0, 4, 0, True),
        ("int8", 1, 1, 1, False),
    ],
)
def test_decode_rows_checks_length_and_dtype(
    dtype: str, rows: int, dim: int, nbytes: int, ok: bool
) -> None:
    if ok:
        out = codec.decode_rows(bytes(nbytes), rows, dim, dtype)
        assert out.shape == (rows, dim)
        assert out.dtype == codec.WIRE_DTYPES[dtype]
    else:
        with pytest.raises(InvalidArgument):
            codec.decode_rows(bytes(nbytes), rows, dim, dtype)


@pytest.mark.parametrize(
    ("declared_dtype", "declared_dim", "ok"),
    [("", 0, True), ("float16", 0, True), ("", 8, True), ("float32", 0, False), ("", 4, False)],
)
def test_declared_dtype_and_dim_must_match(
    declared_dtype: str, declared_dim: int, ok: bool
) -> None:
    if ok:
        codec.check_declared(declared_dtype, declared_dim, "float16", 8)
    else:
        with pytest.raises(InvalidArgument, match="does not match"):
            codec.check_declared(declared_dtype, declared_dim, "float16", 8)


@pytest.mark.parametrize(
    ("requested", "table", "expected"),
    [
        ("", "float16", "float32"),
        ("float32", "bfloat16", "float32"),
        ("float16", "float16", "float16"),
        ("float16", "float32", "float16"),  # 16-bit transport of a float32 table
        ("bfloat16", "float32", "bfloat16"),
        ("float64", "float32", None),
        ("bfloat16", "float16", None),
    ],
)
def test_grad_dtype(requested: str, table: str, expected: str | None) -> None:
    if expected is None:
        with pytest.raises(InvalidArgument, match="grad_dtype"):
            codec.grad_dtype_for(requested, table)
    else:
        assert codec.grad_dtype_for(requested, table) == expected


@pytest.mark.parametrize(
    ("requested", "table", "expected"),
    [
        ("", "float16", "float16"),
        ("", "float32", "float32"),
        ("bfloat16", "float32", "bfloat16"),
        ("float16", "float32", "float16"),
        ("bfloat16", "bfloat16", "bfloat16"),
        (
            "float32",
            "float16",
            None,
        ),  # rows travel in their own dtype, or a float32 table's in 16 bits
        ("float16", "bfloat16", None),
        ("int8", "float32", None),
    ],
)
def test_value_dtype(requested: str, table: str, expected: str | None) -> None:
    if expected is None:
        with pytest.raises(InvalidArgument, match="value_dtype"):
            codec.value_dtype_for(requested, table)
    else:
        assert codec.value_dtype_for(requested, table) == expected


def test_convert_rows_rounds_to_nearest_even() -> None:
    # 1 + 2^-8 lies halfway between the bfloat16 neighbours 1 and 1 + 2^-7: even wins (1);
    # 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: even wins (1 + 2^-6).
    values = np.array([[1 + 2**-8, 1 + 3 * 2**-8, -2.5, 65504.0]], np.float32)
    bf16 = np.empty(values.shape, np.uint16)
    codec.convert_rows(values, "float32", bf16, "bfloat16")
    back = np.empty(values.shape, np.float32)
    codec.convert_rows(bf16, "bfloat16", back, "float32")
    assert back.tolist() == [[1.0, 1 + 2**-6, -2.5, 65536.0]]
    half = np.empty(values.shape, np.float16)
    codec.convert_rows(values, "float32", half, "float16")
    assert half.tolist() == values.astype(np.float16).tolist()  # numpy rounds to nearest even


def test_encode_roundtrip() -> None:
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert codec.decode_rows(codec.encode(values), 3, 4, "float32").tolist() == values.tolist()
    assert codec.encode(values[:, ::2]) == np.ascontiguousarray(values[:, ::2]).tobytes()


def test_misaligned_buffers_are_copied_aligned() -> None:
    raw = bytearray(8 * 4 + 1)
    keys = codec.decode_keys(memoryview(raw)[1:])
    rows = codec.decode_rows(memoryview(raw)[1:], 2, 4, "float32")
    assert keys.ctypes.data % 8 == 0 and rows.ctypes.data % 4 == 0
    assert keys.tolist() == [0] * 4 and rows.shape == (2, 4)


@pytest.mark.parametrize("data", [b"\x0f", b"\x0a\x03em", b"\x0a\x05\x0a\x03\xff\xfe\xfd"])
def test_malformed_requests_are_invalid_argument(data: bytes) -> None:
    for decode in (wire.decode_multi_pull_carrying, wire.decode_multi_update_request):
        with pytest.raises(InvalidArgument):
            decode(data)


def test_a_whole_payload_converts_to_bfloat16_as_torch_rounds_it() -> None:
    """Every rounding case at once, in a payload long enough for the parallel loop."""
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 2**32, 1 << 17, dtype=np.uint64).astype(np.uint32)
    bits[:8] = [
        0x3F808000,
        0x3F818000,
        0x7F800000,
        0xFF800000,
        0x80000000,
        0x00000001,
        0x7F7FFFFF,
        0x7F800001,
    ]  # ties, infinities, -0, subnormal, overflow, sNaN
    values = bits.view(np.float32).reshape(-1, 64)
    bf16 = np.empty(values.shape, np.uint16)
    codec.convert_rows(values, "float32", bf16, "bfloat16")
    expected = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy()
    nan = np.isnan(values)
    assert np.array_equal(bf16[~nan], expected.view(np.uint16)[~nan])
    back = np.empty(values.shape, np.float32)
    codec.convert_rows(bf16, "bfloat16", back, "float32")
    assert np.isnan(back[nan]).all() and nan.any()
