/* netcl_tokens.h: lay token pieces out as the rows of a language-model batch.
 *
 * A batch is `rows` rows of `width` tokens.  Piece i is `n` tokens of a source
 * (a memory-mapped token file's view, or tokens read from a cached copy) that
 * lie at stream position `pos`; the pieces of a row are placed back to back,
 * and the rest of the row is padding.  A segment is a document's part in a
 * row, or a row's padding: every piece starts one, and so does every document
 * end e (sorted `ends`, stream positions, exclusive) with pos < e < pos + n.
 *
 * One pass per piece widens its tokens to int64 into input_ids and writes
 * labels, positions and the segment's start (cu_seqlens) beside them, into
 * arrays the caller owns (a ring slot); nothing is allocated.  The caller
 * checks the pieces, counts the segments (netcl_tokens_segments) to size
 * cu_seqlens, and holds the sources while this runs without the GIL.
 */
#ifndef NETCL_TOKENS_H
#define NETCL_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#if defined(_MSC_VER)
#define NETCL_TOKENS_RESTRICT __restrict
#else
#define NETCL_TOKENS_RESTRICT restrict
#endif

/* PyTorch's cross-entropy ignore_index, which Hugging Face and Megatron use:
 * the label of a position that predicts nothing. */
#define NETCL_TOKENS_IGNORE (-100)

typedef enum {
    NETCL_TOK_U8, NETCL_TOK_I8, NETCL_TOK_U16, NETCL_TOK_I16, NETCL_TOK_U32, NETCL_TOK_I32,
    NETCL_TOK_I64
} netcl_token_type;

typedef struct {
    int64_t *ids, *labels, *pos;    /* (rows, width), C order */
    int32_t *cu;                    /* cu_room + 1 entries: the segments' starts, the total */
    ptrdiff_t rows, width, cu_room;
    const int64_t *ends;            /* sorted document ends */
    ptrdiff_t n_ends;
    int64_t pad_id;
    int shift;                      /* labels shifted (the next token) or aligned */
    ptrdiff_t row;                  /* the row being filled (-1 before the first) */
    ptrdiff_t col;                  /* its columns filled so far */
    ptrdiff_t segments;             /* laid out so far */
    ptrdiff_t max_len;              /* the longest so far */
} netcl_token_rows;

/* The first of the sorted `ends` above `pos` (binary search). */
static inline ptrdiff_t netcl_tokens_end_after(const int64_t *ends, ptrdiff_t n_ends,
                                               int64_t pos) {
    ptrdiff_t lo = 0, hi = n_ends;
    while (lo < hi) {
        ptrdiff_t mid = lo + (hi - lo) / 2;
        if (ends[mid] <= pos)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The segments a piece of n > 0 tokens at pos starts: its own, and one after
 * each document end inside it. */
static inline ptrdiff_t netcl_tokens_segments(const int64_t *ends, ptrdiff_t n_ends, int64_t pos,
                                              ptrdiff_t n) {
    ptrdiff_t k = netcl_tokens_end_after(ends, n_ends, pos), count = 1;
    while (k < n_ends && ends[k] < pos + n) {
        count++;
        k++;
    }
    return count;
}

/* ids[0:n] = s[0:n] widened to int64, and lab[0:n] the same tokens (shifted:
 * each one's next, read from the source too, so that no store is read back);
 * returns s[n] when `more` (else 0).  One loop per token type, which the
 * compiler vectorises. */
#define NETCL_TOKENS_COPY(NAME, T)                                                          \
    static inline int64_t NAME(const T *NETCL_TOKENS_RESTRICT s,                            \
                               int64_t *NETCL_TOKENS_RESTRICT ids,                          \
                               int64_t *NETCL_TOKENS_RESTRICT lab, ptrdiff_t n, int shift,  \
                               int more) {                                                  \
        if (shift) {                                                                        \
            for (ptrdiff_t j = 0; j < n - 1; j++) {                                         \
                ids[j] = s[j];                                                              \
                lab[j] = s[j + 1];                                                          \
            }                                                                               \
            ids[n - 1] = s[n - 1];                                                          \
        } else {                                                                            \
            for (ptrdiff_t j = 0; j < n; j++) {                                             \
                ids[j] = s[j];                                                              \
                lab[j] = s[j];                                                              \
            }                                                                               \
        }                                                                                   \
        return more ? (int64_t)s[n] : 0;                                                    \
    }
NETCL_TOKENS_COPY(netcl_tokens_copy_u8, uint8_t)
NETCL_TOKENS_COPY(netcl_tokens_copy_i8, int8_t)
NETCL_TOKENS_COPY(netcl_tokens_copy_u16, uint16_t)
NETCL_TOKENS_COPY(netcl_tokens_copy_i16, int16_t)
NETCL_TOKENS_COPY(netcl_tokens_copy_u32, uint32_t)
NETCL_TOKENS_COPY(netcl_tokens_copy_i32, int32_t)
NETCL_TOKENS_COPY(netcl_tokens_copy_i64, int64_t)
#undef NETCL_TOKENS_COPY

static inline int64_t netcl_tokens_copy(const void *src, int type, int64_t *ids, int64_t *lab,
                                        ptrdiff_t n, int shift, int more) {
    switch (type) {
    case NETCL_TOK_U8: return netcl_tokens_copy_u8((const uint8_t *)src, ids, lab, n, shift, more);
    case NETCL_TOK_I8: return netcl_tokens_copy_i8((const int8_t *)src, ids, lab, n, shift, more);
    case NETCL_TOK_U16:
        return netcl_tokens_copy_u16((const uint16_t *)src, ids, lab, n, shift, more);
    case NETCL_TOK_I16:
        return netcl_tokens_copy_i16((const int16_t *)src, ids, lab, n, shift, more);
    case NETCL_TOK_U32:
        return netcl_tokens_copy_u32((const uint32_t *)src, ids, lab, n, shift, more);
    case NETCL_TOK_I32:
        return netcl_tokens_copy_i32((const int32_t *)src, ids, lab, n, shift, more);
    default:
        return netcl_tokens_copy_i64((const int64_t *)src, ids, lab, n, shift, more);
    }
}

/* A segment at flat positions a .. b (its ids written): positions from 0, its
 * start in cu, and the label its boundary takes.  Shifted labels: the token at
 * b - 1 ends its document here, so it predicts nothing.  Aligned labels (the
 * model shifts): the first token would be predicted from the one before it,
 * across a boundary. */
static inline void netcl_tokens_segment(netcl_token_rows *o, ptrdiff_t a, ptrdiff_t b) {
    if (o->shift)
        o->labels[b - 1] = NETCL_TOKENS_IGNORE;
    else
        o->labels[a] = NETCL_TOKENS_IGNORE;
    for (ptrdiff_t j = 0; j < b - a; j++)
        o->pos[a + j] = j;
    if (o->segments < o->cu_room)   /* (the caller counted them; never past its array) */
        o->cu[o->segments] = (int32_t)a;
    o->segments++;
    if (b - a > o->max_len)
        o->max_len = b - a;
}

/* Pads the rest of the row being filled (one segment of pad_id, labels
 * ignored) and starts the next row. */
static inline void netcl_tokens_next_row(netcl_token_rows *o) {
    if (o->row >= 0 && o->col < o->width) {
        ptrdiff_t a = o->row * o->width + o->col, b = (o->row + 1) * o->width;
        for (ptrdiff_t j = a; j < b; j++) {
            o->ids[j] = o->pad_id;
            o->labels[j] = NETCL_TOKENS_IGNORE;
        }
        netcl_tokens_segment(o, a, b);
    }
    o->row++;
    o->col = 0;
}

/* One piece of n tokens of `src` (`avail` of them there) at stream position
 * pos, into row `row` (>= the row being filled) after its pieces so far. */
static inline void netcl_tokens_piece(netcl_token_rows *o, const void *src, int type,
                                      ptrdiff_t avail, ptrdiff_t n, int64_t pos, ptrdiff_t row) {
    while (o->row < row)
        netcl_tokens_next_row(o);
    if (n == 0)
        return;
    ptrdiff_t base = row * o->width + o->col;
    ptrdiff_t lo = netcl_tokens_end_after(o->ends, o->n_ends, pos), hi = lo;
    while (hi < o->n_ends && o->ends[hi] < pos + n)
        hi++;
    /* The token after the piece is its last one's label when the source holds
     * it and it continues that token's document (no end at pos + n). */
    int more = o->shift && avail > n && !(hi < o->n_ends && o->ends[hi] == pos + n);
    int64_t follow = netcl_tokens_copy(src, type, o->ids + base, o->labels + base, n, o->shift,
                                       more);
    ptrdiff_t a = base;
    for (; lo < hi; lo++) {
        ptrdiff_t b = base + (ptrdiff_t)(o->ends[lo] - pos);
        netcl_tokens_segment(o, a, b);
        a = b;
    }
    netcl_tokens_segment(o, a, base + n);
    if (more)
        o->labels[base + n - 1] = follow;
    o->col += n;
}

/* After the last piece: the remaining rows padded, and cu's last entry (the
 * total) written.  Returns the segments laid out (the caller compares them
 * with its count). */
static inline ptrdiff_t netcl_tokens_finish(netcl_token_rows *o) {
    if (o->width > 0) {
        while (o->row < o->rows)
            netcl_tokens_next_row(o);
    }
    if (o->segments < o->cu_room + 1)
        o->cu[o->segments] = (int32_t)(o->rows * o->width);
    return o->segments;
}

#endif /* NETCL_TOKENS_H */
