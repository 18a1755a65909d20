/*
 * jinja_str.c - text and number helpers that behave as JavaScript does.
 *
 * The reference renderer runs on JavaScript strings and numbers, so its
 * output depends on JavaScript's rules: what `\s` and trim() call
 * whitespace, that `length` counts UTF-16 code units, how String(0.1 + 0.2)
 * prints, what parseInt("12px") returns.  Each of those rules is
 * reproduced here on UTF-8 text, so that the interpreter proper can just
 * ask for "the JavaScript answer".
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <utf8proc.h>

#include "tokenizer/jinja_int.h"

/* ---- UTF-8 ---- */

/* Decodes one code point of valid UTF-8 (the invariant of jstr). */
int jj_utf8_dec(const char *s, size_t n, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80) {
        *cp = u[0];
        return 1;
    }
    if (u[0] < 0xE0 && n >= 2) {
        *cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
        return 2;
    }
    if (u[0] < 0xF0 && n >= 3) {
        *cp = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
        return 3;
    }
    if (n >= 4) {
        *cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) |
              ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
        return 4;
    }
    *cp = 0xFFFD; /* truncated: cannot happen in a valid string */
    return 1;
}

/* Strict UTF-8: no overlongs, no surrogates, nothing past U+10FFFF. */
bool jj_utf8_valid(const char *s, size_t n, size_t *bad_at) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = u[i];
        size_t len = c < 0x80 ? 1 : c >= 0xC2 && c < 0xE0 ? 2 : c >= 0xE0 && c < 0xF0 ? 3 : c >= 0xF0 && c < 0xF5 ? 4 : 0;
        if (len == 0 || i + len > n) goto bad;
        for (size_t k = 1; k < len; k++)
            if ((u[i + k] & 0xC0) != 0x80) goto bad;
        if (len == 3 && ((c == 0xE0 && u[i + 1] < 0xA0) || (c == 0xED && u[i + 1] >= 0xA0))) goto bad;
        if (len == 4 && ((c == 0xF0 && u[i + 1] < 0x90) || (c == 0xF4 && u[i + 1] >= 0x90))) goto bad;
        i += len;
    }
    return true;
bad:
    if (bad_at) *bad_at = i;
    return false;
}

/* ---- whitespace: JavaScript's \s, which trim() also uses ---- */

bool jj_js_space(uint32_t cp) {
    if (cp < 0x80) return cp == ' ' || (cp >= 9 && cp <= 13);
    return cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}

size_t jj_js_space_at(const char *s, size_t n, size_t i) {
    if (i >= n) return 0;
    uint32_t cp;
    int k = jj_utf8_dec(s + i, n - i, &cp);
    return jj_js_space(cp) ? (size_t)k : 0;
}

/* The whitespace character that ends just before byte i, if any. */
size_t jj_js_space_before(const char *s, size_t i) {
    if (i == 0) return 0;
    size_t b = i - 1;
    while (b > 0 && i - b < 4 && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
    uint32_t cp;
    int k = jj_utf8_dec(s + b, i - b, &cp);
    return (size_t)k == i - b && jj_js_space(cp) ? (size_t)k : 0;
}

void jj_trim(const char *s, size_t n, bool start, bool end, size_t *b, size_t *e) {
    size_t lo = 0, hi = n, k;
    if (start)
        while ((k = jj_js_space_at(s, n, lo)) > 0) lo += k;
    if (end)
        while (hi > lo && (k = jj_js_space_before(s, hi)) > 0) hi -= k;
    *b = lo;
    *e = hi;
}

/* ---- UTF-16 views ---- */

size_t jj_utf16_len(const char *s, size_t n) {
    size_t units = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c & 0xC0) != 0x80) units += c >= 0xF0 ? 2 : 1;
    }
    return units;
}

bool jj_utf16_at(const char *s, size_t n, double i, jj_buf *out) {
    double len = (double)jj_utf16_len(s, n);
    i = isnan(i) ? 0 : trunc(i);
    if (i < 0) i += len;
    if (!(i >= 0 && i < len)) return false;
    size_t want = (size_t)i, unit = 0, p = 0;
    while (p < n) {
        uint32_t cp;
        int k = jj_utf8_dec(s + p, n - p, &cp);
        size_t w = cp >= 0x10000 ? 2 : 1;
        if (want < unit + w) {
            /* half of a surrogate pair: Node encodes it as U+FFFD */
            jj_buf_add_cp(out, w == 2 ? 0xFFFD : cp);
            return true;
        }
        unit += w;
        p += (size_t)k;
    }
    return false;
}

static uint32_t utf16_lead(uint32_t cp) {
    return cp >= 0x10000 ? 0xD800 + ((cp - 0x10000) >> 10) : cp;
}

/* JavaScript's `a < b` on strings compares UTF-16 code units. */
int jj_utf16_cmp(const char *a, size_t an, const char *b, size_t bn) {
    size_t i = 0, j = 0;
    while (i < an && j < bn) {
        uint32_t ca, cb;
        i += (size_t)jj_utf8_dec(a + i, an - i, &ca);
        j += (size_t)jj_utf8_dec(b + j, bn - j, &cb);
        if (ca == cb) continue;
        uint32_t la = utf16_lead(ca), lb = utf16_lead(cb);
        if (la != lb) return la < lb ? -1 : 1;
        return ca < cb ? -1 : 1; /* same lead surrogate: trail order = code point order */
    }
    return i < an ? 1 : j < bn ? -1 : 0;
}

/* ---- case ---- */

/* Full case mappings JavaScript applies that utf8proc's simple ones lack
 * (the common ones; see docs/chat-templates.md). */
static bool special_upper(uint32_t cp, jj_buf *out) {
    static const struct { uint32_t cp; const char *to; } map[] = {
        {0x00DF, "SS"}, {0x0149, "\xCA\xBCN"}, {0xFB00, "FF"}, {0xFB01, "FI"}, {0xFB02, "FL"},
        {0xFB03, "FFI"}, {0xFB04, "FFL"}, {0xFB05, "ST"}, {0xFB06, "ST"},
    };
    for (size_t i = 0; i < PT_ARRAY_LEN(map); i++)
        if (map[i].cp == cp) {
            jj_buf_adds(out, map[i].to);
            return true;
        }
    return false;
}

static void map_cp(uint32_t cp, bool upper, jj_buf *out) {
    if (cp < 0x80) {
        char c = (char)cp;
        if (upper && c >= 'a' && c <= 'z') c = (char)(c - 32);
        if (!upper && c >= 'A' && c <= 'Z') c = (char)(c + 32);
        jj_buf_addc(out, c);
        return;
    }
    if (upper && special_upper(cp, out)) return;
    if (!upper && cp == 0x130) { /* İ lowercases to i + combining dot */
        jj_buf_adds(out, "i\xCC\x87");
        return;
    }
    utf8proc_int32_t m = upper ? utf8proc_toupper((utf8proc_int32_t)cp) : utf8proc_tolower((utf8proc_int32_t)cp);
    jj_buf_add_cp(out, (uint32_t)m);
}

void jj_case_map(const char *s, size_t n, bool upper, jj_buf *out) {
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += (size_t)jj_utf8_dec(s + i, n - i, &cp);
        map_cp(cp, upper, out);
    }
}

static bool ascii_word(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* value.replace(/\b\w/g, toUpperCase): only ASCII word characters that
 * start a word change; the rest of the word is left alone. */
void jj_title(const char *s, size_t n, jj_buf *out) {
    bool prev_word = false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        bool w = ascii_word(c);
        jj_buf_addc(out, (char)(w && !prev_word && c >= 'a' && c <= 'z' ? c - 32 : c));
        prev_word = w;
    }
}

/* charAt(0).toUpperCase() + slice(1): a first character outside the BMP is
 * half a surrogate pair to charAt, which does not change case. */
void jj_capitalize(const char *s, size_t n, jj_buf *out) {
    if (n == 0) return;
    uint32_t cp;
    int k = jj_utf8_dec(s, n, &cp);
    if (cp >= 0x10000)
        jj_buf_add(out, s, (size_t)k);
    else
        map_cp(cp, true, out);
    jj_buf_add(out, s + k, n - (size_t)k);
}

/* ---- numbers ---- */

/* Adds delta (+1 or -1) to the last digit of a "%.*e" mantissa in place;
 * false when that would change the number of digits. */
static bool bump_last_digit(char *m, int delta) {
    char *first = m + (m[0] == '-');
    for (char *p = strchr(m, 'e') - 1; p >= first; p--) {
        if (*p == '.') continue;
        if (*p == (delta > 0 ? '9' : '0')) { /* carry or borrow */
            *p = delta > 0 ? '0' : '9';
            continue;
        }
        *p = (char)(*p + delta);
        return !(p == first && *p == '0');
    }
    return false;
}

/* The shortest "%.*e" text that reads back as x.  At a power of two the
 * nearest p-digit decimal can miss while its neighbour hits (the interval
 * below is half the one above), so the neighbours are tried too, as a
 * shortest-digits algorithm finds them. */
static void shortest_e(double x, char *tmp, size_t cap) {
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, cap, "%.*e", prec - 1, x);
        if (strtod(tmp, NULL) == x) return;
        char alt[40];
        for (int d = 1; d >= -1; d -= 2) {
            snprintf(alt, sizeof alt, "%s", tmp);
            if (bump_last_digit(alt, d) && strtod(alt, NULL) == x) {
                snprintf(tmp, cap, "%s", alt);
                return;
            }
        }
    }
}

/* Number::toString: the shortest digits that read back as x, laid out in
 * fixed notation for exponents -7 < e < 21 and in exponent notation else. */
const char *jj_num_fmt(double x, char *buf) {
    if (isnan(x)) return "NaN";
    if (isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
    if (x == 0) return "0";
    char tmp[40];
    shortest_e(x, tmp, sizeof tmp);
    char digits[24] = {0};
    int k = 0;
    const char *p = tmp;
    bool neg = *p == '-';
    if (neg) p++;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[k++] = *p;
    while (k > 1 && digits[k - 1] == '0') k--;
    int n = atoi(p + 1) + 1; /* x = 0.d1d2..dk * 10^n */
    char *o = buf;
    if (neg) *o++ = '-';
    if (k <= n && n <= 21) {
        memcpy(o, digits, (size_t)k), o += k;
        for (int i = k; i < n; i++) *o++ = '0';
    } else if (0 < n && n <= 21) {
        memcpy(o, digits, (size_t)n), o += n;
        *o++ = '.';
        memcpy(o, digits + n, (size_t)(k - n)), o += k - n;
    } else if (-6 < n && n <= 0) {
        *o++ = '0', *o++ = '.';
        for (int i = 0; i < -n; i++) *o++ = '0';
        memcpy(o, digits, (size_t)k), o += k;
    } else {
        *o++ = digits[0];
        if (k > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)(k - 1)), o += k - 1;
        }
        o += sprintf(o, "e%c%d", n - 1 >= 0 ? '+' : '-', abs(n - 1));
    }
    *o = 0;
    return buf;
}

/* FloatValue.toString: x % 1 === 0 ? x.toFixed(1) : x.toString(). */
const char *jj_float_fmt(double x, char *buf) {
    if (x == 0 && signbit(x)) return "-0.0";
    if (isfinite(x) && fmod(x, 1) == 0) {
        if (fabs(x) >= 1e21) return jj_num_fmt(x, buf); /* toFixed gives up there too */
        snprintf(buf, 400, "%.1f", x);
        return buf;
    }
    return jj_num_fmt(x, buf);
}

static size_t skip_space(const char *s, size_t n, size_t i) {
    size_t k;
    while ((k = jj_js_space_at(s, n, i)) > 0) i += k;
    return i;
}

static size_t digits_at(const char *s, size_t n, size_t i) {
    size_t j = i;
    while (j < n && s[j] >= '0' && s[j] <= '9') j++;
    return j - i;
}

static double parse_prefix(const char *s, size_t n) {
    char tmp[512];
    if (n >= sizeof tmp) { /* absurdly long numerals: keep the significant part */
        char *heap = pt_xmalloc(n + 1);
        memcpy(heap, s, n);
        heap[n] = 0;
        double v = strtod(heap, NULL);
        free(heap);
        return v;
    }
    memcpy(tmp, s, n);
    tmp[n] = 0;
    return strtod(tmp, NULL);
}

double jj_parse_int(const char *s, size_t n) {
    size_t i = skip_space(s, n, 0), start = i;
    if (i < n && (s[i] == '+' || s[i] == '-')) i++;
    size_t d = digits_at(s, n, i);
    if (d == 0) return NAN;
    return parse_prefix(s + start, i + d - start);
}

/* Length of a StrDecimalLiteral at s[i..] (0 if none); sets *inf. */
static size_t decimal_literal(const char *s, size_t n, size_t i, bool *inf) {
    size_t j = i;
    *inf = false;
    if (j < n && (s[j] == '+' || s[j] == '-')) j++;
    if (n - j >= 8 && memcmp(s + j, "Infinity", 8) == 0) {
        *inf = true;
        return j + 8 - i;
    }
    size_t intd = digits_at(s, n, j), fracd = 0;
    j += intd;
    if (j < n && s[j] == '.') {
        fracd = digits_at(s, n, j + 1);
        if (intd > 0 || fracd > 0) j += 1 + fracd;
    }
    if (intd == 0 && fracd == 0) return 0;
    if (j < n && (s[j] == 'e' || s[j] == 'E')) {
        size_t e = j + 1;
        if (e < n && (s[e] == '+' || s[e] == '-')) e++;
        size_t ed = digits_at(s, n, e);
        if (ed > 0) j = e + ed;
    }
    return j - i;
}

double jj_parse_float(const char *s, size_t n) {
    size_t i = skip_space(s, n, 0);
    bool inf;
    size_t len = decimal_literal(s, n, i, &inf);
    if (len == 0) return NAN;
    if (inf) return s[i] == '-' ? -INFINITY : INFINITY;
    return parse_prefix(s + i, len);
}

double jj_to_number(const char *s, size_t n) {
    size_t b, e;
    jj_trim(s, n, true, true, &b, &e);
    if (b == e) return 0;
    s += b, n = e - b;
    if (n > 2 && s[0] == '0' && strchr("xXoObB", s[1])) {
        int base = s[1] == 'x' || s[1] == 'X' ? 16 : s[1] == 'o' || s[1] == 'O' ? 8 : 2;
        double v = 0;
        for (size_t i = 2; i < n; i++) {
            int d = s[i] >= '0' && s[i] <= '9' ? s[i] - '0'
                  : s[i] >= 'a' && s[i] <= 'f' ? s[i] - 'a' + 10
                  : s[i] >= 'A' && s[i] <= 'F' ? s[i] - 'A' + 10 : 99;
            if (d >= base) return NAN;
            v = v * base + d;
        }
        return v;
    }
    bool inf;
    size_t len = decimal_literal(s, n, 0, &inf);
    if (len != n) return NAN;
    if (inf) return s[0] == '-' ? -INFINITY : INFINITY;
    return parse_prefix(s, n);
}

/* ---- JSON.stringify of a string ---- */

void jj_json_quote(const char *s, size_t n, bool ascii, jj_buf *out) {
    static const char hex[] = "0123456789abcdef";
    jj_buf_addc(out, '"');
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = jj_utf8_dec(s + i, n - i, &cp);
        char esc[16];
        switch (cp) {
        case '"': jj_buf_adds(out, "\\\""); break;
        case '\\': jj_buf_adds(out, "\\\\"); break;
        case '\b': jj_buf_adds(out, "\\b"); break;
        case '\f': jj_buf_adds(out, "\\f"); break;
        case '\n': jj_buf_adds(out, "\\n"); break;
        case '\r': jj_buf_adds(out, "\\r"); break;
        case '\t': jj_buf_adds(out, "\\t"); break;
        default:
            if (cp < 0x20 || (ascii && cp >= 0x7F)) {
                /* ensure_ascii works on UTF-16 units: astral = two escapes */
                uint32_t units[2] = {cp, 0};
                int nu = 1;
                if (cp >= 0x10000) {
                    units[0] = 0xD800 + ((cp - 0x10000) >> 10);
                    units[1] = 0xDC00 + ((cp - 0x10000) & 0x3FF);
                    nu = 2;
                }
                for (int u = 0; u < nu; u++) {
                    esc[0] = '\\', esc[1] = 'u';
                    for (int h = 0; h < 4; h++) esc[2 + h] = hex[(units[u] >> (12 - 4 * h)) & 15];
                    jj_buf_add(out, esc, 6);
                }
            } else {
                jj_buf_add(out, s + i, (size_t)k);
            }
        }
        i += (size_t)k;
    }
    jj_buf_addc(out, '"');
}
