/*
 * The CRC-32C kernels (speedups.h lists the extension's files): the checksum of v2 record batches,
 * for the column walk (columns.c) and for protocol/records.py's batch checks.
 */

#include "speedups.h"

/* ------------------------------------------------------------------ CRC-32C
 *
 * The v2 batch checksum (Castagnoli, reflected polynomial 0x82F63B78), for the column walk,
 * which checks every batch without a call into the ``crc32c`` package per batch.  On x86-64 with
 * SSE4.2 it runs six interleaved streams of the CRC32 instruction over blocks of CRC_BLOCK bytes
 * (its latency is three times its throughput, and newer cores, AMD's Zen 5 among them, run two at
 * once: six streams take 64 GB/s there, three 32), then three for what is left, and joins them:
 * the state after a block of data is linear in the state before it, so the state of stream one
 * after CRC_BLOCK more bytes is ``crc_skip_block(state)`` (four table lookups), XORed with stream
 * two's, which started at 0; and so on down the streams.
 * Where the core also has VPCLMULQDQ (with AVX-512: Intel since Ice Lake, AMD since Zen 4; with
 * AVX2 only: AMD's Zen 3, Intel's client cores since Alder Lake), inputs of CRC_FOLD_MIN bytes or
 * more are folded instead (crc_fold512, crc_fold256): the CRC is a remainder modulo the
 * polynomial P, and a 16-byte block followed by D more bits may be replaced by
 * lo * (x^(D+32) mod P) + hi * (x^(D-32) mod P) (its two halves times constants, carry-less
 * products of at most 96 bits) XORed into the block D bits later, with the same remainder; four
 * 64-byte registers fold 256 bytes a step (four 32-byte ones 128), 32 bytes a cycle against the
 * CRC32 instruction's 8.  The last 16 bytes folded go through the CRC32 instruction, which
 * finishes the remainder.
 * Elsewhere a byte-at-a-time table does the same work, and the Python side does not use the walk
 * to check CRCs (``HW_CRC32C`` is False).  ``crc32c_kernel(name, data)`` runs one of them by name
 * (``CRC32C_KERNELS``, the ones this machine has, best first), for the tests.
 */

#define CRC32C_POLY 0x82F63B78u
#define CRC_BLOCK 1024 /* bytes per stream in the three-stream loop: a multiple of 8 */

static uint32_t crc_table[256];
static uint32_t crc_block_table[4][256]; /* [k][v]: the state v << 8k after CRC_BLOCK zero bytes */

static uint32_t
crc_sw(uint32_t c, const unsigned char *p, size_t n)
{
    while (n--) {
        c = crc_table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    }
    return c;
}

static inline uint32_t
crc_skip_block(uint32_t c)
{
    return crc_block_table[0][c & 0xFF] ^ crc_block_table[1][(c >> 8) & 0xFF] ^ crc_block_table[2][(c >> 16) & 0xFF] ^
           crc_block_table[3][c >> 24];
}

static void
crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        }
        crc_table[i] = c;
    }
    /* A state's bits after CRC_BLOCK zero bytes, one bit at a time; a byte's table is their XORs. */
    uint32_t bit[32];
    for (int b = 0; b < 32; b++) {
        uint32_t c = (uint32_t)1 << b;
        for (int i = 0; i < CRC_BLOCK; i++) {
            c = crc_table[c & 0xFF] ^ (c >> 8);
        }
        bit[b] = c;
    }
    for (int k = 0; k < 4; k++) {
        for (uint32_t v = 0; v < 256; v++) {
            uint32_t c = 0;
            for (int b = 0; b < 8; b++) {
                if (v & (1u << b)) {
                    c ^= bit[8 * k + b];
                }
            }
            crc_block_table[k][v] = c;
        }
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HAVE_HW_CRC 1

/* The state after ``streams`` consecutive blocks of CRC_BLOCK bytes from ``p``, from state ``c``:
 * one stream per block, run side by side, joined in order.  Inlined with a constant ``streams``,
 * the streams stay in registers. */
__attribute__((target("sse4.2"), always_inline)) static inline uint32_t
crc_blocks(uint32_t c, const unsigned char *p, int streams)
{
    uint64_t s[6] = {c, 0, 0, 0, 0, 0};
    for (size_t at = 0; at < CRC_BLOCK; at += 8) {
        for (int i = 0; i < streams; i++) {
            uint64_t a;
            memcpy(&a, p + (size_t)i * CRC_BLOCK + at, 8);
            s[i] = _mm_crc32_u64(s[i], a);
        }
    }
    c = (uint32_t)s[0];
    for (int i = 1; i < streams; i++) {
        c = crc_skip_block(c) ^ (uint32_t)s[i];
    }
    return c;
}

__attribute__((target("sse4.2"))) static uint32_t
crc_hw(uint32_t c, const unsigned char *p, size_t n)
{
    for (; n >= 6 * CRC_BLOCK; p += 6 * CRC_BLOCK, n -= 6 * CRC_BLOCK) {
        c = crc_blocks(c, p, 6);
    }
    if (n >= 3 * CRC_BLOCK) {
        c = crc_blocks(c, p, 3);
        p += 3 * CRC_BLOCK;
        n -= 3 * CRC_BLOCK;
    }
    uint64_t c64 = c;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t a;
        memcpy(&a, p, 8);
        c64 = _mm_crc32_u64(c64, a);
    }
    c = (uint32_t)c64;
    while (n--) {
        c = _mm_crc32_u8(c, *p++);
    }
    return c;
}
#endif

#if defined(HAVE_HW_CRC) && (defined(__clang__) || __GNUC__ >= 10)
#include <immintrin.h>
#define HAVE_FOLD_CRC 1
#define CRC_FOLD_MIN 256 /* bytes: below this crc_hw is as fast */

/* Per 128-bit lane, the constants that fold a block D bits forward: x^(D+32) mod P for its first
 * 8 bytes (the low qword), x^(D-32) mod P for the next 8, each bit-reflected in 32 bits and
 * shifted left by one (a carry-less product of reflected operands comes out one bit short).
 */
#define FOLD_K(d_plus, d_minus) _mm_set_epi64x((long long)(d_minus), (long long)(d_plus))
#define K_2048 FOLD_K(0xdcb17aa4u, 0xb9e02b86u)
#define K_1024 FOLD_K(0x6992cea2u, 0x0d3b6092u)
#define K_512 FOLD_K(0x740eef02u, 0x9e4addf8u)
#define K_384 FOLD_K(0x1c291d04u, 0x1d82c63daull)
#define K_256 FOLD_K(0x1384aa63aull, 0xba4fc28eu)
#define K_128 FOLD_K(0xf20c0dfeu, 0x14cd00bd6ull)

/* The remainder of the folded last block ``r`` (16 bytes), carried on by crc_hw over the ``n``
 * bytes left at ``p`` (fewer than one step).  The wide registers' upper halves are cleared first
 * (the compiler leaves them set for a tail call): legacy SSE code run after them, the
 * interpreter's, would take a merge per instruction, 150 ns a call here. */
__attribute__((target("avx,sse4.2"), always_inline)) static inline uint32_t
fold_finish(__m128i r, const unsigned char *p, size_t n)
{
    uint64_t first = (uint64_t)_mm_cvtsi128_si64(r), second = (uint64_t)_mm_extract_epi64(r, 1);
    _mm256_zeroupper();
    return crc_hw((uint32_t)_mm_crc32_u64(_mm_crc32_u64(0, first), second), p, n);
}

/* ``acc`` folded forward by the distance the constants ``k`` are for, XORed into ``data``. */
__attribute__((target("avx512f,vpclmulqdq"), always_inline)) static inline __m512i
fold_512(__m512i acc, __m512i k, __m512i data)
{
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(acc, k, 0x00), _mm512_clmulepi64_epi128(acc, k, 0x11),
                                     data, 0x96);
}

__attribute__((target("avx2,vpclmulqdq"), always_inline)) static inline __m256i
fold_256(__m256i acc, __m256i k, __m256i data)
{
    return _mm256_xor_si256(
        _mm256_xor_si256(_mm256_clmulepi64_epi128(acc, k, 0x00), _mm256_clmulepi64_epi128(acc, k, 0x11)), data);
}

/* crc_hw's result for ``n`` >= CRC_FOLD_MIN bytes, folded in four 64-byte registers, 256 bytes a
 * step.  The state ``c`` is XORed into the first four bytes: the CRC's state is linear that way. */
__attribute__((target("avx512f,vpclmulqdq,sse4.2"))) static uint32_t
crc_fold512(uint32_t c, const unsigned char *p, size_t n)
{
    const __m512i k2048 = _mm512_broadcast_i32x4(K_2048), k512 = _mm512_broadcast_i32x4(K_512);
    __m512i x0 = _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, (long long)c));
    __m512i x1 = _mm512_loadu_si512(p + 64), x2 = _mm512_loadu_si512(p + 128), x3 = _mm512_loadu_si512(p + 192);
    for (p += 256, n -= 256; n >= 256; p += 256, n -= 256) {
        x0 = fold_512(x0, k2048, _mm512_loadu_si512(p));
        x1 = fold_512(x1, k2048, _mm512_loadu_si512(p + 64));
        x2 = fold_512(x2, k2048, _mm512_loadu_si512(p + 128));
        x3 = fold_512(x3, k2048, _mm512_loadu_si512(p + 192));
    }
    x3 = fold_512(fold_512(fold_512(x0, k512, x1), k512, x2), k512, x3);
    /* x3's four blocks into its last: the first three folded 384, 256 and 128 bits forward */
    const __m512i lanes = _mm512_inserti32x4(
        _mm512_inserti32x4(_mm512_inserti32x4(_mm512_setzero_si512(), K_384, 0), K_256, 1), K_128, 2);
    __m512i t = _mm512_xor_si512(_mm512_clmulepi64_epi128(x3, lanes, 0x00), _mm512_clmulepi64_epi128(x3, lanes, 0x11));
    return fold_finish(_mm_xor_si128(_mm_xor_si128(_mm512_extracti32x4_epi32(t, 0), _mm512_extracti32x4_epi32(t, 1)),
                                     _mm_xor_si128(_mm512_extracti32x4_epi32(t, 2), _mm512_extracti32x4_epi32(x3, 3))),
                       p, n);
}

/* The same in four 32-byte registers, 128 bytes a step: for cores with VPCLMULQDQ but without
 * AVX-512 (AMD's Zen 3, Intel's client cores since Alder Lake). */
__attribute__((target("avx2,vpclmulqdq,pclmul,sse4.2"))) static uint32_t
crc_fold256(uint32_t c, const unsigned char *p, size_t n)
{
    const __m256i k1024 = _mm256_broadcastsi128_si256(K_1024), k256 = _mm256_broadcastsi128_si256(K_256);
    __m256i x0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)p), _mm256_set_epi64x(0, 0, 0, (long long)c));
    __m256i x1 = _mm256_loadu_si256((const __m256i *)(p + 32)), x2 = _mm256_loadu_si256((const __m256i *)(p + 64));
    __m256i x3 = _mm256_loadu_si256((const __m256i *)(p + 96));
    for (p += 128, n -= 128; n >= 128; p += 128, n -= 128) {
        x0 = fold_256(x0, k1024, _mm256_loadu_si256((const __m256i *)p));
        x1 = fold_256(x1, k1024, _mm256_loadu_si256((const __m256i *)(p + 32)));
        x2 = fold_256(x2, k1024, _mm256_loadu_si256((const __m256i *)(p + 64)));
        x3 = fold_256(x3, k1024, _mm256_loadu_si256((const __m256i *)(p + 96)));
    }
    x3 = fold_256(fold_256(fold_256(x0, k256, x1), k256, x2), k256, x3);
    const __m128i k128 = K_128, first = _mm256_castsi256_si128(x3);
    return fold_finish(_mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(first, k128, 0x00),
                                                   _mm_clmulepi64_si128(first, k128, 0x11)),
                                     _mm256_extracti128_si256(x3, 1)),
                       p, n);
}
#endif

enum { CRC_TABLE, CRC_STREAMS, CRC_FOLD256, CRC_FOLD512 };
static const char *const crc_kernel_names[] = {"table", "streams", "fold256", "fold512"};
static int crc_kernel = CRC_TABLE;         /* the best this machine has (crc_detect) */
static unsigned crc_kernels = 1u << CRC_TABLE; /* all it has, a bit each */

/* The CRC-32C state ``c`` (not inverted) carried over ``n`` more bytes by ``kernel``. */
static inline uint32_t
crc_with(int kernel, uint32_t c, const unsigned char *p, size_t n)
{
#ifdef HAVE_FOLD_CRC
    if (kernel >= CRC_FOLD256 && n >= CRC_FOLD_MIN) {
        return kernel == CRC_FOLD512 ? crc_fold512(c, p, n) : crc_fold256(c, p, n);
    }
#endif
#ifdef HAVE_HW_CRC
    if (kernel != CRC_TABLE) {
        return crc_hw(c, p, n);
    }
#endif
    return crc_sw(c, p, n);
}

/* The CRC-32C state ``c`` (not inverted) carried over ``n`` more bytes. */
uint32_t
crc_update(uint32_t c, const unsigned char *p, size_t n)
{
    return crc_with(crc_kernel, c, p, n);
}

/* CRC-32C of ``n`` bytes. */
uint32_t
crc32c(const unsigned char *p, size_t n)
{
    return ~crc_update(0xFFFFFFFFu, p, n);
}

static void
crc_detect(void)
{
#ifdef HAVE_HW_CRC
    __builtin_cpu_init();
    crc_kernels |= (unsigned)(__builtin_cpu_supports("sse4.2") != 0) << CRC_STREAMS;
#ifdef HAVE_FOLD_CRC
    /* (the AVX checks include the operating system's: that it saves the wide registers) */
    if ((crc_kernels & (1u << CRC_STREAMS)) && __builtin_cpu_supports("vpclmulqdq") &&
        __builtin_cpu_supports("pclmul")) {
        crc_kernels |= (unsigned)(__builtin_cpu_supports("avx2") != 0) << CRC_FOLD256;
        crc_kernels |= (unsigned)(__builtin_cpu_supports("avx512f") != 0) << CRC_FOLD512;
    }
#endif
#endif
    for (int kernel = CRC_TABLE; kernel <= CRC_FOLD512; kernel++) {
        if (crc_kernels & (1u << kernel)) {
            crc_kernel = kernel;
        }
    }
}

PyObject *
crc32c_py(PyObject *module, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    uint32_t c = crc32c((const unsigned char *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

PyObject *
crc32c_kernel_py(PyObject *module, PyObject *args)
{
    const char *name;
    Py_buffer view;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "sy*|I:crc32c_kernel", &name, &view, &value)) {
        return NULL;
    }
    for (int kernel = CRC_TABLE; kernel <= CRC_FOLD512; kernel++) {
        if ((crc_kernels & (1u << kernel)) && strcmp(name, crc_kernel_names[kernel]) == 0) {
            uint32_t c = crc_with(kernel, ~(uint32_t)value, (const unsigned char *)view.buf, (size_t)view.len);
            PyBuffer_Release(&view);
            return PyLong_FromUnsignedLong(~c);
        }
    }
    PyBuffer_Release(&view);
    PyErr_Format(PyExc_ValueError, "no CRC-32C kernel %R on this machine (see CRC32C_KERNELS)", PyTuple_GET_ITEM(args, 0));
    return NULL;
}

int
crc_setup(PyObject *module)
{
    crc_init();
    crc_detect();
    if (PyModule_AddIntConstant(module, "HW_CRC32C", (crc_kernels >> CRC_STREAMS) & 1u) < 0) {
        return -1;
    }
    /* the CRC-32C kernels this machine has, best first */
    PyObject *kernels = PyList_New(0);
    for (int kernel = CRC_FOLD512; kernels != NULL && kernel >= CRC_TABLE; kernel--) {
        if (!(crc_kernels & (1u << kernel))) {
            continue;
        }
        PyObject *name = PyUnicode_FromString(crc_kernel_names[kernel]);
        if (name == NULL || PyList_Append(kernels, name) < 0) {
            Py_XDECREF(name);
            Py_CLEAR(kernels);
            break;
        }
        Py_DECREF(name);
    }
    Py_XSETREF(kernels, kernels == NULL ? NULL : PyList_AsTuple(kernels));
    if (kernels == NULL || PyModule_AddObject(module, "CRC32C_KERNELS", kernels) < 0) {
        Py_XDECREF(kernels);
        return -1;
    }
    return 0;
}
