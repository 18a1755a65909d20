#!/usr/bin/env python3
# qmma-emu.py - replays src/backend/cuda/qmma.cu's data flow on the CPU,
# lane by lane, for one format and shape: the stage loader (aligned 16-byte
# words and each row's offset), the bit-level decode into f16 pairs, the
# q4_0 activation permutation, the A/B/C fragment layouts of
# mma.sync m16n8k16 and ldmatrix.x4 (as attention.cu uses them, tested on
# the GPU), and the epilogue's row/token mapping.  f16 rounding through
# struct's 'e' format; the products are exact in double, so the result
# must equal the f16 reference (weights and activations rounded to f16)
# to ~1e-16 of sum |w x|.  Checks the layout logic, not the CUDA code
# itself: keep the two in step when either changes.
#
#   scripts/qmma-emu.py q4_0|q8_0 ROWS COLS TOKENS    (COLS a multiple of 32)
#   e.g. scripts/qmma-emu.py q4_0 5 544 11   (rows not 16-byte aligned)
import struct, random, sys
def f16(x): return struct.unpack('<e', struct.pack('<e', x))[0]
def h2f(bits): return struct.unpack('<e', struct.pack('<H', bits & 0xffff))[0]
def f2h(x): return struct.unpack('<H', struct.pack('<e', x))[0]
def half2(u):  # u32 -> (lo, hi) floats
    return (h2f(u & 0xffff), h2f(u >> 16))
def pack2(lo, hi): return f2h(lo) | f2h(hi) << 16
def byte_perm(a, b, sel):
    bs = list(a.to_bytes(4, 'little')) + list(b.to_bytes(4, 'little'))
    return int.from_bytes(bytes(bs[(sel >> (4*i)) & 7] for i in range(4)), 'little')

F = sys.argv[1]; ROWS = int(sys.argv[2]); K = int(sys.argv[3]); M = int(sys.argv[4])
random.seed(1)
bb = 18 if F == 'q4_0' else 34
row_bytes = K // 32 * bb
wbuf = bytearray()
for r in range(ROWS):
    for blk in range(K // 32):
        d = f2h(random.uniform(0.001, 0.02) * random.choice([1, -1]))
        wbuf += struct.pack('<H', d) + bytes(random.randrange(256) for _ in range(bb - 2))
wbuf += bytes(32)  # slack past the end (aligned words)
def deq(r, k):
    b = r * row_bytes + (k // 32) * bb; d = h2f(struct.unpack_from('<H', wbuf, b)[0]); i = k % 32
    if F == 'q4_0':
        byte = wbuf[b + 2 + (i % 16)]; n = byte & 15 if i < 16 else byte >> 4
        return f16((n - 8) * d)
    q = wbuf[b + 2 + i]; q = q - 256 if q >= 128 else q
    return f16(q * d)
x = [[random.uniform(-1, 1) for _ in range(K)] for _ in range(M)]
KP = (K + 255) // 256 * 256
# activation kernel
xa = [[0.0] * KP for _ in range(M)]
for m in range(M):
    for c in range(0, KP, 16):
        for p in range(8):
            e0, e1 = 2*p, 2*p+1
            if F == 'q4_0':
                h, tt = p >> 2, p & 3; e0, e1 = 2*tt + h, 2*tt + h + 8
            v0 = x[m][c+e0] if c < K else 0.0; v1 = x[m][c+e1] if c < K else 0.0
            xa[m][c+2*p] = f16(v0); xa[m][c+2*p+1] = f16(v1)
BN, KT, AROW_H = 256, 256, 264  # AROW in halves (528 bytes)
stride = (144 if F == 'q4_0' else 272) + (0 if K % 256 == 0 else 16)
lanes_per_row = 16 if F == 'q4_0' else 32
BM = 32 if M <= 32 else 64; NT = BM // 8
y = [[0.0] * ROWS for _ in range(M)]
kts = (K + KT - 1) // KT
for m0 in range(0, M, BM):
  for r0 in range(0, ROWS, BN):
    acc = {}  # (warp, lane, mt, nt, e) -> float
    for kt in range(kts):
        c0 = kt * KT; left = K - c0
        # loader: weights
        ws = bytearray(BN * stride)
        off0 = c0 // 32 * bb; tbytes = min(left, KT) // 32 * bb
        for i in range(BN):
            gr = min(r0 + i, ROWS - 1); start = gr * row_bytes + off0
            a16 = start >> 4; nw = ((start + tbytes + 15) >> 4) - a16
            assert nw <= lanes_per_row and nw * 16 <= stride, (nw, stride)
            for word in range(nw):
                ws[i*stride + 16*word: i*stride + 16*word + 16] = wbuf[16*(a16+word): 16*(a16+word)+16]
        # loader: activations [BM][AROW_H] halves
        As = [[None] * AROW_H for _ in range(BM)]
        for tk in range(BM):
            m = min(m0 + tk, M - 1)
            for ch in range(32):
                for e in range(8): As[tk][8*ch + e] = xa[m][c0 + 8*ch + e]
        nb = min(left, KT) // 32
        def lds16(off): return ws[off] | ws[off+1] << 8
        for warp in range(8):
            regs = {}
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                for mt in range(2):
                    for h in range(2):
                        rr = min(r0 + 32*warp + 16*mt + 8*h + g, ROWS - 1)
                        regs[(lane, mt, h)] = (32*warp + 16*mt + 8*h + g) * stride + ((rr * row_bytes + off0) & 15)
            for j in range(nb):
                # decode per lane
                A = {}
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    for mt in range(2):
                        for h in range(2):
                            b = regs[(lane, mt, h)] + bb * j
                            dd = byte_perm(lds16(b), 0, 0x1010); d = half2(dd)[0]
                            p = [[0, 0], [0, 0]]
                            if F == 'q4_0':
                                q = lds16(b + 2 + 2*t) | lds16(b + 10 + 2*t) << 16; q1 = q >> 8
                                LO, HI, EX = 0x000F000F, 0x00F000F0, 0x64006400
                                def lo(v): a = half2((v & LO) | EX); return pack2(f16(f16(a[0]-1032)*d), f16(f16(a[1]-1032)*d))
                                def hi(v): a = half2((v & HI) | EX); return pack2(f16(f16(a[0]/16-72)*d), f16(f16(a[1]/16-72)*d))
                                p = [[lo(q), lo(q1)], [hi(q), hi(q1)]]
                            else:
                                for s in range(2):
                                    for hh in range(2):
                                        v = lds16(b + 2 + 16*s + 8*hh + 2*t) ^ 0x8080
                                        e = byte_perm(v, 0x6464, 0x5140); a = half2(e)
                                        p[s][hh] = pack2(f16(f16(a[0]-1152)*d), f16(f16(a[1]-1152)*d))
                            for step in range(2):
                                A[(lane, mt, step, h)] = p[step][0]
                                A[(lane, mt, step, 2 + h)] = p[step][1]
                for nt in range(NT):
                    # ldmatrix x4: lane l -> row (l&7) of matrix (l>>3) at col 32j + 8*(l>>3)
                    addr = {l: (nt*8 + (l & 7), 32*j + 8*(l >> 3)) for l in range(32)}
                    Bm = {}
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        for i in range(4):
                            rowi = [l for l in range(32) if (l >> 3) == i and (l & 7) == g][0]
                            tk, col = addr[rowi]
                            Bm[(lane, i)] = pack2(As[tk][col + 2*t], As[tk][col + 2*t + 1])
                    for mt in range(2):
                        for step in range(2):
                            # build matrices from fragments, PTX m16n8k16 layout
                            Amat = [[0.0]*16 for _ in range(16)]; Bmat = [[0.0]*8 for _ in range(16)]
                            for lane in range(32):
                                g, t = lane >> 2, lane & 3
                                a = [half2(A[(lane, mt, step, r)]) for r in range(4)]
                                Amat[g][2*t], Amat[g][2*t+1] = a[0]
                                Amat[g+8][2*t], Amat[g+8][2*t+1] = a[1]
                                Amat[g][2*t+8], Amat[g][2*t+9] = a[2]
                                Amat[g+8][2*t+8], Amat[g+8][2*t+9] = a[3]
                                b0 = half2(Bm[(lane, 2*step)]); b1 = half2(Bm[(lane, 2*step+1)])
                                Bmat[2*t][g], Bmat[2*t+1][g] = b0
                                Bmat[2*t+8][g], Bmat[2*t+9][g] = b1
                            for lane in range(32):
                                g, t = lane >> 2, lane & 3
                                for e in range(4):
                                    row = g + 8*(e >> 1); col = 2*t + (e & 1)
                                    s_ = sum(Amat[row][k]*Bmat[k][col] for k in range(16))
                                    acc[(warp, lane, mt, nt, e)] = acc.get((warp, lane, mt, nt, e), 0.0) + s_
    for (warp, lane, mt, nt, e), v in acc.items():
        g, t = lane >> 2, lane & 3
        r = r0 + 32*warp + 16*mt + 8*(e >> 1) + g; m = m0 + nt*8 + 2*t + (e & 1)
        if r < ROWS and m < M: y[m][r] = v
worst = 0
for m in range(M):
    for r in range(ROWS):
        ref = sum(deq(r, k) * f16(x[m][k]) for k in range(K))
        S = sum(abs(deq(r, k) * x[m][k]) for k in range(K))
        worst = max(worst, abs(y[m][r] - ref) / (S + 1e-30))
print(F, ROWS, K, M, "worst |y - ref| / S =", worst)
assert worst < 1e-6, worst
