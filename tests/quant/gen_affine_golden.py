#!/usr/bin/env python3
"""gen_affine_golden.py - golden vectors for MLX affine quantization.

Writes tests/quant/data/affine_golden.json: for every bits (2, 3, 4, 5, 6, 8)
x group size (32, 64, 128) x scale dtype (f16, bf16, f32) and several kinds
of rows (random, constant, zeros, extreme ranges, either sign dominant), the
packed uint32 words, the stored scales and biases and the dequantized f32
values, all as hex of their bits.

This is a second, independent implementation of the formulas, written from
MLX's documentation and its CPU quantizer's structure rather than from our C:
plain Python with every f32 operation rounded through struct (an f32 op done
in double and rounded once is exact IEEE f32), Python's round() (halfway to
even, like rint), and packing that follows MLX's own pack loop: el_per_int
codes OR-ed into one integer, stored as a uint32 for 2/4/8 bits, or split
into 3 (3 and 6 bits) or 5 (5 bits) little-endian bytes.

Run: python3 tests/quant/gen_affine_golden.py > tests/quant/data/affine_golden.json
"""
import json
import math
import random
import struct
import sys


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f16_bits(x):
    try:
        return struct.unpack("<H", struct.pack("<e", x))[0]
    except OverflowError:
        return 0x7C00 if x > 0 else 0xFC00


def f16_val(x):
    return struct.unpack("<e", struct.pack("<H", f16_bits(x)))[0]


def bf16_bits(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    u += 0x7FFF + ((u >> 16) & 1)  # round to nearest even
    return (u >> 16) & 0xFFFF


def bf16_val(x):
    return struct.unpack("<f", struct.pack("<I", bf16_bits(x) << 16))[0]


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


SCALE_TYPES = {
    "f16": (f16_bits, f16_val, 2),
    "bf16": (bf16_bits, bf16_val, 2),
    "f32": (f32_bits, f32, 4),
}


def group_params(w, bits):
    """MLX's scale and bias for one group, in f32."""
    n_bins = f32((1 << bits) - 1)
    w_min, w_max = min(w), max(w)
    mask = abs(w_min) > abs(w_max)
    scale = max(f32(f32(w_max - w_min) / n_bins), f32(1e-7))
    scale = scale if mask else -scale
    edge = w_min if mask else w_max
    q0 = round(f32(edge / scale))
    bias = 0.0
    if q0 != 0:
        scale = f32(edge / q0)
        bias = edge
    return scale, bias


def quantize_row(w, bits, gs):
    n_bins = (1 << bits) - 1
    codes, scales, biases = [], [], []
    for g in range(0, len(w), gs):
        s, b = group_params(w[g:g + gs], bits)
        for x in w[g:g + gs]:
            q = round(f32(f32(x - b) / s))
            codes.append(min(max(q, 0), n_bins))
        scales.append(s)
        biases.append(b)
    return codes, scales, biases


def pack_row(codes, bits):
    """MLX's pack loop, literally; returns the row's bytes."""
    pow2 = bits & (bits - 1) == 0
    el_per_int = {3: 8, 5: 8, 6: 4}.get(bits, 32 // bits)
    bytes_per_pack = 4 if pow2 else (5 if bits == 5 else 3)
    out = bytearray()
    for j in range(0, len(codes), el_per_int):
        v = 0
        for k in range(el_per_int):
            v |= codes[j + k] << (k * bits)
        out += v.to_bytes(bytes_per_pack, "little")
    return bytes(out)


def make_rows(cols, rng):
    rows = {}
    rows["random"] = [f32(rng.gauss(0, 0.05)) for _ in range(cols)]
    rows["constant"] = [f32(0.3)] * cols
    rows["zeros"] = [0.0] * cols
    rows["negative_constant"] = [f32(-1.75)] * cols
    rows["max_dominant"] = [f32(rng.uniform(-0.2, 1.0)) for _ in range(cols)]
    rows["min_dominant"] = [f32(rng.uniform(-1.0, 0.2)) for _ in range(cols)]
    rows["extreme_range"] = [f32((60000.0 if i % 7 == 0 else 1e-3) * rng.uniform(-1, 1)) for i in range(cols)]
    rows["tiny"] = [f32(1e-9 * rng.uniform(-1, 1)) for _ in range(cols)]
    rows["ramp"] = [f32(-1.0 + 2.0 * i / (cols - 1)) for i in range(cols)]
    return rows


def main():
    rng = random.Random(20241129)
    cols = 256
    rows = make_rows(cols, rng)
    cases = []
    for bits in (2, 3, 4, 5, 6, 8):
        for gs in (32, 64, 128):
            for st, (to_bits, to_val, size) in SCALE_TYPES.items():
                for kind, w in rows.items():
                    codes, scales, biases = quantize_row(w, bits, gs)
                    packed = pack_row(codes, bits)
                    deq = []
                    for g in range(len(scales)):
                        s, b = to_val(scales[g]), to_val(biases[g])
                        for q in codes[g * gs:(g + 1) * gs]:
                            deq.append(f32(f32(s * q) + b))
                    fmt = "<H" if size == 2 else "<I"
                    cases.append({
                        "bits": bits, "group_size": gs, "scale_dtype": st, "kind": kind,
                        "packed_hex": packed.hex(),
                        "scales_hex": b"".join(struct.pack(fmt, to_bits(s)) for s in scales).hex(),
                        "biases_hex": b"".join(struct.pack(fmt, to_bits(b)) for b in biases).hex(),
                        "dequant_f32_hex": b"".join(struct.pack("<f", x) for x in deq).hex(),
                    })
    inputs = {k: b"".join(struct.pack("<f", x) for x in w).hex() for k, w in rows.items()}
    json.dump({"source": "tests/quant/gen_affine_golden.py", "cols": cols,
               "inputs_f32_hex": inputs, "cases": cases}, sys.stdout, indent=0)


if __name__ == "__main__":
    main()
