/* Prints every code point that PCRE2 (UTF|UCP, the build plumb links) matches with the one-character pattern
 * argv[1], one decimal per line. Used by gen_unicode_delta.sh. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>

static int encode(unsigned cp, unsigned char *o) {
  if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
  if (cp < 0x800) { o[0] = 0xC0 | cp >> 6; o[1] = 0x80 | (cp & 63); return 2; }
  if (cp < 0x10000) { o[0] = 0xE0 | cp >> 12; o[1] = 0x80 | ((cp >> 6) & 63); o[2] = 0x80 | (cp & 63); return 3; }
  o[0] = 0xF0 | cp >> 18; o[1] = 0x80 | ((cp >> 12) & 63); o[2] = 0x80 | ((cp >> 6) & 63); o[3] = 0x80 | (cp & 63);
  return 4;
}

int main(int argc, char **argv) {
  int err; PCRE2_SIZE off;
  if (argc != 2) return 2;
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)argv[1], PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
  if (!re) return 1;
  pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
  for (unsigned cp = 0; cp < 0x110000; cp++) {
    unsigned char b[4];
    if (cp >= 0xD800 && cp < 0xE000) continue;
    int n = encode(cp, b);
    if (pcre2_match(re, b, (PCRE2_SIZE)n, 0, PCRE2_ANCHORED, md, NULL) > 0) printf("%u\n", cp);
  }
  return 0;
}
