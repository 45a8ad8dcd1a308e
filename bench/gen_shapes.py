#!/usr/bin/env python3
"""Rule sets of shapes the shared sets lack, for scan_bench and rules check.

    bench/gen_shapes.py SHAPE [N] [SEED] > FILE.rules

SHAPE: ids (a mix of the IDS-like shapes below), one of their names, or
anchors / hexjump (binary signatures: two exact bytes, a gap, two bytes).
scan_bench reads a set in place of gitleaks-regex with --data DIR where
DIR/gitleaks/gitleaks-regex.rules is the set and
DIR/rebar/haystacks/sherlock.txt the haystack (docs/PERFORMANCE.md
"Session 28").
"""
import random
import string
import sys


def word(r):
    return ''.join(r.choice(string.ascii_lowercase) for _ in range(r.randint(4, 9)))


def alt(r, n):
    return '(?:' + '|'.join(word(r) for _ in range(n)) + ')'


def hexbyte(r):
    return '\\x%02x' % r.randrange(256)


SHAPES = {
    'php': lambda r: 'GET /[a-z]{2,8}/[^\\s?]*\\.php\\?%s=[^&\\s]{0,64}%s' % (word(r), alt(r, 3)),
    'agent': lambda r: 'User-Agent:\\s*[^\\r\\n]{0,200}%s' % alt(r, 4),
    'assign': lambda r: '(?i)%s\\s*[:=]\\s*\\S{6,}' % word(r),
    'hash': lambda r: '\\b%s[0-9a-f]{%d}\\b' % (word(r), r.choice([16, 24, 32, 40, 64])),
    'call': lambda r: '%s\\(.*%s' % (word(r), word(r)),
    'anchors': lambda r: '%s%s.{%d}%s%s' % (hexbyte(r), hexbyte(r), r.randint(4, 80),
                                            hexbyte(r), hexbyte(r)),
    'words': lambda r: '%s\\s+\\d{1,6}\\s+%s' % (alt(r, 20), word(r)),
    'near': lambda r: '(?s)%s.{0,%d}%s' % (word(r), r.randint(10, 300), word(r)),
    'b64': lambda r: '[A-Za-z0-9+/]{%d,}={0,2}%s' % (r.randint(20, 60), word(r)),
    'header': lambda r: '(?m)^%s:[ \\t]*[^\\r\\n]{1,%d}$' % (word(r), r.randint(20, 120)),
    'quoted': lambda r: '%s[^%s]{%d,%d}%s' % (word(r), r.choice('"\'<>;'), r.randint(0, 5),
                                            r.randint(10, 60), word(r)),
    'spaced': lambda r: '(?i)(?:%s)(?:\\.|\\s){1,3}(?:%s)' % (word(r), word(r)),
}


def main():
    shape = sys.argv[1] if len(sys.argv) > 1 else 'ids'
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    r = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    for i in range(n):
        if shape == 'hexjump':
            print('%d:{%02x %02x [%d] %02x %02x}' % (i, r.randrange(256), r.randrange(256),
                                                     r.randint(4, 80), r.randrange(256),
                                                     r.randrange(256)))
        elif shape == 'ids':
            print('%d:/%s/' % (i, SHAPES[r.choice(sorted(SHAPES))](r)))
        else:
            print('%d:/%s/' % (i, SHAPES[shape](r)))


if __name__ == '__main__':
    main()
