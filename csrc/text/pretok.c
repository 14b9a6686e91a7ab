/* Pre-tokenizers. llama.cpp splits BPE input with a list of regexes applied in sequence: each
 * regex cuts every piece left by the previous one into its matches and the gaps between them
 * (src/llama-vocab.cpp lists them per tokenizer.ggml.pre; src/unicode.cpp runs them). Here
 * each regex is a hand-written splitter over code points that finds the same matches:
 *
 *   - the GPT-2, Llama 3 and Qwen2 patterns follow llama.cpp's own hand-written versions of
 *     them (unicode_regex_split_custom_*), quirks included;
 *   - the other patterns llama.cpp runs through std::regex on a "collapsed" text in which
 *     every code point >= 128 is replaced by one byte standing for its class (\p{N}, \p{L}...),
 *     or, for patterns without \p{..}, on the code points with non-ASCII whitespace replaced
 *     by U+000B. Those classes are what the splitters below test; for ASCII the two agree.
 *
 * A splitter appends the lengths (in code points) of consecutive pieces covering [a, b). */
#include "text/text_internal.h"

#define OUT_OF_RANGE 0xFFFFFFFFu

/* A piece list being built over [a, b): remembers where the last piece ended. */
typedef struct {
    bubo_u32vec *out;
    size_t prev_end;
    int ok;
} cutter;

static inline void cut(cutter *c, size_t end) {
    if (end > c->prev_end) c->ok &= bubo_u32vec_push(c->out, (uint32_t)(end - c->prev_end));
    c->prev_end = end;
}

/* Flags of the code point at p as llama.cpp's lambdas see them: 0 outside [a, b), otherwise
 * the class bits plus IN_RANGE (llama.cpp's "flags.as_uint() != 0": an unassigned code point
 * has no class but is still "something"). */
#define IN_RANGE 0x100u

typedef struct {
    const uint32_t *cps;
    const uint8_t *fl;
    size_t a, b;
} span;

static inline uint32_t cpt_at(const span *s, size_t p) {
    return (p >= s->a && p < s->b) ? s->cps[p] : OUT_OF_RANGE;
}
static inline unsigned fl_at(const span *s, size_t p) {
    return (p >= s->a && p < s->b) ? (s->fl[p] | IN_RANGE) : 0u;
}

static inline uint32_t ascii_lower(uint32_t c) {
    /* exact for the contraction test: gen_unicode.py checks no other code point lowercases to
     * one of the letters it looks for */
    return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}

/* 's|'t|'re|'ve|'m|'ll|'d, optionally case-insensitive; returns the match length or 0. */
static inline size_t contraction(const span *s, size_t pos, int fold) {
    if (cpt_at(s, pos) != '\'' || pos + 1 >= s->b) return 0;
    uint32_t c1 = cpt_at(s, pos + 1);
    if (fold) c1 = ascii_lower(c1);
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
    if (pos + 2 < s->b) {
        uint32_t c2 = cpt_at(s, pos + 2);
        if (fold) c2 = ascii_lower(c2);
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
    }
    return 0;
}

#define WS BUBO_UC_WHITESPACE
#define LT BUBO_UC_LETTER
#define NM BUBO_UC_NUMBER

// ---------------------------------------------------------------------------------------------
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+

static void split_gpt2(const span *s, cutter *c) {
    for (size_t pos = s->a; pos < s->b;) {
        const uint32_t cpt = cpt_at(s, pos);
        const unsigned flags = fl_at(s, pos);

        size_t k = contraction(s, pos, 0);
        if (k) {
            pos += k;
            cut(c, pos);
            continue;
        }
        unsigned f2 = cpt == ' ' ? fl_at(s, pos + 1) : flags;
        if (f2 & LT) { /* ' ?\p{L}+' */
            pos += cpt == ' ';
            while (f2 & LT) f2 = fl_at(s, ++pos);
            cut(c, pos);
            continue;
        }
        if (f2 & NM) { /* ' ?\p{N}+' */
            pos += cpt == ' ';
            while (f2 & NM) f2 = fl_at(s, ++pos);
            cut(c, pos);
            continue;
        }
        if (!(f2 & (WS | LT | NM)) && f2) { /* ' ?[^\s\p{L}\p{N}]+' */
            pos += cpt == ' ';
            while (!(f2 & (WS | LT | NM)) && f2) f2 = fl_at(s, ++pos);
            cut(c, pos);
            continue;
        }
        size_t n_ws = 0;
        while (fl_at(s, pos + n_ws) & WS) n_ws++;
        if (n_ws > 1 && cpt_at(s, pos + n_ws) != OUT_OF_RANGE) { /* '\s+(?!\S)' */
            pos += n_ws - 1;
            cut(c, pos);
            continue;
        }
        if (n_ws > 0) { /* '\s+' */
            pos += n_ws;
            cut(c, pos);
            continue;
        }
        cut(c, ++pos); /* no match: a piece of one */
    }
}

// ---------------------------------------------------------------------------------------------
// Llama 3 (max_digits 3):
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// Qwen2 (max_digits 1): the same with \p{N} alone.

static void split_llama3(const span *s, cutter *c, size_t max_digits) {
    for (size_t pos = s->a; pos < s->b;) {
        const uint32_t cpt = cpt_at(s, pos);
        const unsigned flags = fl_at(s, pos);

        size_t k = contraction(s, pos, 1);
        if (k) {
            pos += k;
            cut(c, pos);
            continue;
        }
        if (!(cpt == '\r' || cpt == '\n' || (flags & NM))) { /* '[^\r\n\p{L}\p{N}]?\p{L}+' */
            if ((flags & LT) || (fl_at(s, pos + 1) & LT)) {
                pos++;
                while (fl_at(s, pos) & LT) pos++;
                cut(c, pos);
                continue;
            }
        }
        if (flags & NM) { /* '\p{N}{1,max_digits}' */
            size_t ini = pos;
            while (fl_at(s, pos) & NM) {
                if (++pos - ini >= max_digits) {
                    cut(c, pos);
                    ini = pos;
                }
            }
            cut(c, pos);
            continue;
        }
        /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' (llama.cpp tests the first code point's own flags here) */
        unsigned f2 = cpt == ' ' ? fl_at(s, pos + 1) : flags;
        if (!(f2 & (WS | LT | NM)) && flags) {
            pos += cpt == ' ';
            while (!(f2 & (WS | LT | NM)) && f2) f2 = fl_at(s, ++pos);
            uint32_t c2 = cpt_at(s, pos);
            while (c2 == '\r' || c2 == '\n') c2 = cpt_at(s, ++pos);
            cut(c, pos);
            continue;
        }
        size_t n_ws = 0, last_rn_end = 0;
        while (fl_at(s, pos + n_ws) & WS) {
            uint32_t c2 = cpt_at(s, pos + n_ws);
            if (c2 == '\r' || c2 == '\n') last_rn_end = pos + n_ws + 1;
            n_ws++;
        }
        if (last_rn_end > 0) { /* '\s*[\r\n]+' */
            pos = last_rn_end;
            cut(c, pos);
            continue;
        }
        if (n_ws > 1 && cpt_at(s, pos + n_ws) != OUT_OF_RANGE) { /* '\s+(?!\S)' */
            pos += n_ws - 1;
            cut(c, pos);
            continue;
        }
        if (n_ws > 0) { /* '\s+' */
            pos += n_ws;
            cut(c, pos);
            continue;
        }
        cut(c, ++pos);
    }
}

// ---------------------------------------------------------------------------------------------
// Single-class patterns: every match of "X" (each_alone) or "X+" becomes a piece, and so does
// every gap between matches.

typedef int (*cp_class)(uint32_t cp, uint8_t flags);

static void split_class(const span *s, cutter *c, cp_class in_class, int each_alone) {
    size_t pos = s->a;
    while (pos < s->b) {
        if (!in_class(s->cps[pos], s->fl[pos])) {
            pos++;
            continue;
        }
        cut(c, pos); /* the gap before the match */
        if (each_alone) {
            pos++;
        } else {
            while (pos < s->b && in_class(s->cps[pos], s->fl[pos])) pos++;
        }
        cut(c, pos);
    }
    cut(c, s->b);
}

static int class_number(uint32_t cp, uint8_t fl) { return (fl & NM) != 0; }

/* [\p{P}\$\+<=>\^~\|] and falcon's, which adds the backtick */
static int class_punct_default(uint32_t cp, uint8_t fl) {
    return (fl & BUBO_UC_PUNCT) || cp == '$' || cp == '+' || cp == '<' || cp == '=' || cp == '>' ||
           cp == '^' || cp == '~' || cp == '|';
}
static int class_punct_falcon(uint32_t cp, uint8_t fl) { return class_punct_default(cp, fl) || cp == '`'; }

static int class_cr_lf(uint32_t cp, uint8_t fl) { return cp == '\r' || cp == '\n'; }

/* [0-9][0-9][0-9]: runs of ASCII digits in threes from the left; a shorter tail is a gap */
static int is_ascii_digit(uint32_t cp) { return cp >= '0' && cp <= '9'; }

static void split_digit_triples(const span *s, cutter *c) {
    size_t pos = s->a;
    while (pos < s->b) {
        if (pos + 3 <= s->b && is_ascii_digit(s->cps[pos]) && is_ascii_digit(s->cps[pos + 1]) &&
            is_ascii_digit(s->cps[pos + 2])) {
            cut(c, pos);
            pos += 3;
            cut(c, pos);
        } else {
            pos++;
        }
    }
    cut(c, s->b);
}

// ---------------------------------------------------------------------------------------------
// deepseek-llm. Its patterns have no \p{..}, so llama.cpp runs them with std::wregex over the
// code points, after replacing non-ASCII whitespace by U+000B; \s is then ASCII whitespace.

typedef struct {
    uint32_t lo, hi;
} cp_range;

/* the letter class of "\s?[A-Za-zµÀ-ÖØ-öø-ƺ...]+" */
static const cp_range deepseek_letters[] = {
    {0x00041, 0x0005A}, {0x00061, 0x0007A}, {0x000B5, 0x000B5}, {0x000C0, 0x000D6}, {0x000D8, 0x000F6},
    {0x000F8, 0x001BA}, {0x001BC, 0x001BF}, {0x001C4, 0x00293}, {0x00295, 0x002AF}, {0x00370, 0x00373},
    {0x00376, 0x00377}, {0x0037B, 0x0037D}, {0x0037F, 0x0037F}, {0x00386, 0x00386}, {0x00388, 0x0038A},
    {0x0038C, 0x0038C}, {0x0038E, 0x003A1}, {0x003A3, 0x003F5}, {0x003F7, 0x00481}, {0x0048A, 0x0052F},
    {0x00531, 0x00556}, {0x010A0, 0x010C5}, {0x013A0, 0x013F5}, {0x013F8, 0x013FD}, {0x01C90, 0x01CBA},
    {0x01CBD, 0x01CBF}, {0x01D00, 0x01D2B}, {0x01D6B, 0x01D77}, {0x01D79, 0x01D9A}, {0x01E00, 0x01F15},
    {0x01F18, 0x01F1D}, {0x01F20, 0x01F45}, {0x01F48, 0x01F4D}, {0x01F50, 0x01F57}, {0x01F59, 0x01F59},
    {0x01F5B, 0x01F5B}, {0x01F5D, 0x01F5D}, {0x01F5F, 0x01F7D}, {0x01F80, 0x01FB4}, {0x01FB6, 0x01FBC},
    {0x01FBE, 0x01FBE}, {0x01FC2, 0x01FC4}, {0x01FC6, 0x01FCC}, {0x01FD0, 0x01FD3}, {0x01FD6, 0x01FDB},
    {0x01FE0, 0x01FEC}, {0x01FF2, 0x01FF4}, {0x01FF6, 0x01FFC}, {0x02102, 0x02102}, {0x02107, 0x02107},
    {0x0210A, 0x02113}, {0x02115, 0x02115}, {0x02119, 0x0211D}, {0x02124, 0x02124}, {0x02126, 0x02126},
    {0x02128, 0x02128}, {0x0212A, 0x0212D}, {0x0212F, 0x02134}, {0x02139, 0x02139}, {0x0213C, 0x0213F},
    {0x02145, 0x02149}, {0x0214E, 0x0214E}, {0x02183, 0x02184}, {0x02C00, 0x02C7B}, {0x02C7E, 0x02CE4},
    {0x02CEB, 0x02CEE}, {0x02CF2, 0x02CF3}, {0x0A640, 0x0A66D}, {0x0A680, 0x0A69B}, {0x0A722, 0x0A76F},
    {0x0A771, 0x0A787}, {0x0A78B, 0x0A78E}, {0x0AB70, 0x0ABBF}, {0x0FB00, 0x0FB06}, {0x0FB13, 0x0FB17},
    {0x0FF21, 0x0FF3A}, {0x0FF41, 0x0FF5A}, {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};
/* "\s?[!-/:-~！-／：-～‘-‟　-。]+" (":-~" takes in the ASCII letters too, as written) */
static const cp_range deepseek_punct[] = {
    {0x21, 0x2F}, {0x3A, 0x7E}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E}, {0x2018, 0x201F}, {0x3000, 0x3002},
};
/* "[一-龥ࠀ-一가-퟿]+" */
static const cp_range deepseek_cjk[] = {{0x4E00, 0x9FA5}, {0x0800, 0x4E00}, {0xAC00, 0xD7FF}};

static inline uint32_t wide_cp(const span *s, size_t p) {
    uint32_t cp = s->cps[p];
    return (cp > 0x7F && (s->fl[p] & WS)) ? 0x0B : cp;
}
static inline int wide_space(uint32_t cp) { return cp == ' ' || (cp >= 0x09 && cp <= 0x0D); }

static int in_ranges(uint32_t cp, const cp_range *r, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (cp >= r[i].lo && cp <= r[i].hi) return 1;
    return 0;
}

/* \s?[R]+ */
static void split_opt_space_run(const span *s, cutter *c, const cp_range *r, size_t nr) {
    size_t pos = s->a;
    while (pos < s->b) {
        size_t start = pos, p = pos;
        if (wide_space(wide_cp(s, p)) && p + 1 < s->b && in_ranges(wide_cp(s, p + 1), r, nr)) {
            p++;
        }
        if (!in_ranges(wide_cp(s, p), r, nr)) {
            pos++;
            continue;
        }
        while (p < s->b && in_ranges(wide_cp(s, p), r, nr)) p++;
        cut(c, start);
        cut(c, p);
        pos = p;
    }
    cut(c, s->b);
}

/* [R]+ */
static void split_run(const span *s, cutter *c, const cp_range *r, size_t nr) {
    size_t pos = s->a;
    while (pos < s->b) {
        if (!in_ranges(wide_cp(s, pos), r, nr)) {
            pos++;
            continue;
        }
        cut(c, pos);
        while (pos < s->b && in_ranges(wide_cp(s, pos), r, nr)) pos++;
        cut(c, pos);
    }
    cut(c, s->b);
}

/* \s+$ : the whitespace run that ends the piece */
static void split_trailing_space(const span *s, cutter *c) {
    size_t p = s->b;
    while (p > s->a && wide_space(wide_cp(s, p - 1))) p--;
    cut(c, p);
    cut(c, s->b);
}

// ---------------------------------------------------------------------------------------------
// The lists

typedef enum {
    RX_GPT2,
    RX_LLAMA3,
    RX_QWEN2,
    RX_NUMBER_EACH,   /* \p{N}   */
    RX_NUMBER_RUN,    /* \p{N}+  */
    RX_DIGIT_TRIPLES, /* [0-9][0-9][0-9] */
    RX_PUNCT_DEFAULT, /* [\p{P}\$\+<=>\^~\|]+ */
    RX_PUNCT_FALCON,  /* [\p{P}\$\+<=>\^~\|`]+ */
    RX_CR_LF_EACH,    /* [\r\n] */
    RX_DS_LETTERS,    /* \s?[A-Za-z...]+ */
    RX_DS_PUNCT,      /* \s?[!-/:-~...]+ */
    RX_TRAILING_WS,   /* \s+$ */
    RX_DS_CJK,        /* [一-龥ࠀ-一가-퟿]+ */
    RX_END
} regex_id;

static const regex_id pre_lists[][7] = {
    [BUBO_PRE_DEFAULT] = {RX_PUNCT_DEFAULT, RX_GPT2, RX_NUMBER_RUN, RX_DIGIT_TRIPLES, RX_END},
    [BUBO_PRE_GPT2] = {RX_GPT2, RX_END},
    [BUBO_PRE_LLAMA3] = {RX_LLAMA3, RX_END},
    [BUBO_PRE_QWEN2] = {RX_QWEN2, RX_END},
    [BUBO_PRE_STARCODER] = {RX_NUMBER_EACH, RX_GPT2, RX_END},
    [BUBO_PRE_FALCON] = {RX_PUNCT_FALCON, RX_GPT2, RX_DIGIT_TRIPLES, RX_END},
    [BUBO_PRE_DEEPSEEK_LLM] = {RX_CR_LF_EACH, RX_DS_LETTERS, RX_DS_PUNCT, RX_TRAILING_WS, RX_DS_CJK,
                               RX_NUMBER_RUN, RX_END},
};

#define N_RANGES(r) (sizeof(r) / sizeof(r[0]))

static void run_regex(regex_id rx, const span *s, cutter *c) {
    switch (rx) {
    case RX_GPT2: split_gpt2(s, c); break;
    case RX_LLAMA3: split_llama3(s, c, 3); break;
    case RX_QWEN2: split_llama3(s, c, 1); break;
    case RX_NUMBER_EACH: split_class(s, c, class_number, 1); break;
    case RX_NUMBER_RUN: split_class(s, c, class_number, 0); break;
    case RX_DIGIT_TRIPLES: split_digit_triples(s, c); break;
    case RX_PUNCT_DEFAULT: split_class(s, c, class_punct_default, 0); break;
    case RX_PUNCT_FALCON: split_class(s, c, class_punct_falcon, 0); break;
    case RX_CR_LF_EACH: split_class(s, c, class_cr_lf, 1); break;
    case RX_DS_LETTERS: split_opt_space_run(s, c, deepseek_letters, N_RANGES(deepseek_letters)); break;
    case RX_DS_PUNCT: split_opt_space_run(s, c, deepseek_punct, N_RANGES(deepseek_punct)); break;
    case RX_TRAILING_WS: split_trailing_space(s, c); break;
    case RX_DS_CJK: split_run(s, c, deepseek_cjk, N_RANGES(deepseek_cjk)); break;
    case RX_END: break;
    }
}

int bubo_pretokenize(bubo_pre_type pre, const bubo_cpview *v, bubo_u32vec *words, bubo_u32vec *tmp) {
    const regex_id *list = pre_lists[pre];
    words->n = 0;
    if (v->n == 0) return 1;
    /* each pass reads the pieces of the previous one from `in` and writes `out` */
    bubo_u32vec *in = tmp, *out = words;
    in->n = 0;
    if (!bubo_u32vec_push(in, (uint32_t)v->n)) return 0;
    for (const regex_id *rx = list; *rx != RX_END; rx++) {
        out->n = 0;
        size_t start = 0;
        for (size_t i = 0; i < in->n; i++) {
            span s = {v->cps, v->flags, start, start + in->v[i]};
            cutter c = {out, s.a, 1};
            run_regex(*rx, &s, &c);
            if (!c.ok) return 0;
            start = s.b;
        }
        bubo_u32vec *t = in;
        in = out;
        out = t;
    }
    if (in != words) { /* the pieces ended up in the scratch vector: trade places */
        bubo_u32vec t = *words;
        *words = *tmp;
        *tmp = t;
    }
    return 1;
}
