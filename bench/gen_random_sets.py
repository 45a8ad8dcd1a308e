#!/usr/bin/env python3
"""Random rule sets and hit-dense haystacks for bench/gpu_diff.sh.

    bench/gen_random_sets.py DIR COUNT [SEED]

Writes DIR/NNN.rules and DIR/NNN.hay for NNN in 0..COUNT-1. Each set draws
its rules from a grammar of the shapes real sets hold and the shared sets
lack: bounded gaps (`a.{0,40}b`, `[^;]{3,60}`), counted repeats (`x{3,7}`,
`\\d{12,}`), alternations, classes, binary bytes and hex strings with
wildcards and jumps, caseless and dot-all flags, `^`/`$`/`\\b`/`\\B`, and
single-match rules. Every set has its own small vocabulary of words and
bytes, and its haystack is built from the same vocabulary, with random
bytes and newlines between, so the rules match often (hit-dense) and on
text cut anywhere. SPARSE=1 makes every set sparse (long words, rare in
the haystack, and a word in every regex), for large files. Some sets also
hold rules with the start-of-match flag `L`; gpu_diff leaves their stream
check out (streams refuse `L`).
"""
import os
import random
import sys

CLASSES = ['[a-z]', '[A-Z0-9]', '\\d', '\\w', '\\s', '[^\\n]', '.', '[0-9a-f]',
           '[^;]', '[ -~]', '\\W', '[\\x00-\\x1f]', '[^a-z]', '\\S']


def esc_byte(b):
    c = chr(b)
    if c.isascii() and c.isalnum():
        return c
    return '\\x%02x' % b


class Gen:
    def __init__(self, r, sparse=False):
        self.r = r
        # dense sets: short words of few letters, a haystack mostly of them;
        # sparse sets: longer words, a haystack mostly of other bytes
        self.dense = not sparse and r.random() < 0.6
        self.sparse = sparse
        letters, lo, hi = ('abcdefghijklmnop', 2, 7) if self.dense else (
            'abcdefghijklmnopqrstuvwxyz', 5, 12)
        self.words = [''.join(r.choice(letters) for _ in range(r.randint(lo, hi)))
                      for _ in range(r.randint(6, 24))]
        self.bytes = [r.randrange(256) for _ in range(r.randint(4, 12))]

    def quant(self, big=False):
        r = self.r
        k = r.random()
        if big and k < 0.5:
            m = r.randint(0, 40)
            return '{%d,%d}' % (m, m + r.randint(1, 300))
        if k < 0.2:
            return '?'
        if k < 0.35:
            return '+'
        if k < 0.45:
            return '*'
        if k < 0.65:
            return '{%d}' % r.randint(1, 12)
        if k < 0.85:
            m = r.randint(0, 8)
            return '{%d,%d}' % (m, m + r.randint(1, 20))
        return '{%d,}' % r.randint(1, 16)

    def atom(self, depth):
        r = self.r
        k = r.random()
        if k < 0.40:
            return r.choice(self.words)
        if k < 0.60:
            return r.choice(CLASSES) + self.quant(big=r.random() < 0.3)
        if k < 0.70:
            return ''.join(esc_byte(r.choice(self.bytes)) for _ in range(r.randint(1, 4)))
        if k < 0.78:
            return r.choice(self.words) + '?'
        if k < 0.88 and depth < 2:
            alts = [self.seq(depth + 1, r.randint(1, 3)) for _ in range(r.randint(2, 4))]
            g = '(?:' + '|'.join(alts) + ')'
            if r.random() < 0.3:
                g += self.quant()
            return g
        if k < 0.94:
            return '[%s]' % ''.join(r.choice(w) for w in r.sample(self.words, 2)) + self.quant()
        return r.choice(['\\b', '\\B']) + r.choice(self.words)

    def seq(self, depth, n):
        return ''.join(self.atom(depth) for _ in range(n))

    def regex(self):
        r = self.r
        body = self.seq(0, r.randint(1, 5))
        # most real rules hold a literal part; a few are broad on purpose
        if (self.sparse or r.random() < 0.9) and not any(w in body for w in self.words):
            body = r.choice(self.words) + body if r.random() < 0.5 else body + r.choice(self.words)
        if r.random() < 0.15:
            body = '^' + body
        if r.random() < 0.12:
            body = body + '$'
        if r.random() < 0.15:
            body = '\\b' + body
        if r.random() < 0.1:
            body = body + '\\b'
        flags = ''.join(f for f, p in (('i', 0.25), ('s', 0.2), ('m', 0.2), ('H', 0.08))
                        if r.random() < p)
        return '/%s/%s' % (body, flags)

    def hexrule(self):
        r = self.r
        parts = []
        for _ in range(r.randint(2, 6)):
            k = r.random()
            if k < 0.7:
                parts.append('%02x' % r.choice(self.bytes))
            elif k < 0.85:
                parts.append('??')
            else:
                parts.append('[%d]' % r.randint(1, 30))
        # a hex string must start and end with a byte
        return '{%02x %s %02x}' % (r.choice(self.bytes), ' '.join(parts), r.choice(self.bytes))

    def literal(self):
        r = self.r
        s = r.choice(self.words)
        if r.random() < 0.5:
            s += r.choice(self.words)
        if r.random() < 0.3:
            s += ''.join('\\x%02x' % r.choice(self.bytes) for _ in range(r.randint(1, 2)))
        return '"%s"' % s

    def rule(self, som):
        r = self.r
        k = r.random()
        if k < 0.65:
            rule = self.regex()
            if som and r.random() < 0.3 and 'H' not in rule:
                rule += 'L'
            return rule
        if k < 0.85:
            return self.literal()
        return self.hexrule()

    def haystack(self, size):
        r = self.r
        out = bytearray()
        while len(out) < size:
            k = r.random()
            if not self.dense and k < 0.4 and r.random() < 0.8:
                k = 0.72 + 0.28 * r.random()
            if k < 0.45:
                w = r.choice(self.words)
                out += (w.upper() if r.random() < 0.15 else w).encode()
            elif k < 0.6:
                out.append(r.choice(self.bytes))
            elif k < 0.72:
                out += r.choice([b' ', b'\n', b';', b'  ', b'\t', b'\r\n'])
            elif k < 0.85:
                out += bytes(r.choice(b'0123456789abcdefXYZ') for _ in range(r.randint(1, 20)))
            elif k < 0.95:
                out += bytes(r.randrange(256) for _ in range(r.randint(1, 8)))
            else:
                # a long run, for counted repeats and gaps
                out += bytes([r.choice(b'a0 \x00.')]) * r.randint(10, 400)
        return bytes(out[:size])


def main():
    if len(sys.argv) < 3:
        sys.exit('usage: gen_random_sets.py DIR COUNT [SEED]')
    d, count = sys.argv[1], int(sys.argv[2])
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    sparse = os.environ.get('SPARSE') == '1'

    os.makedirs(d, exist_ok=True)
    for i in range(count):
        r = random.Random(seed * 100003 + i)
        g = Gen(r, sparse)
        som = r.random() < 0.3
        n = r.choice([1, 3, 10, 40, 150, 600])
        with open(os.path.join(d, '%03d.rules' % i), 'w') as f:
            if som:
                f.write('# has L rules\n')
            for j in range(n):
                f.write('%d:%s\n' % (j, g.rule(som)))
        with open(os.path.join(d, '%03d.hay' % i), 'wb') as f:
            f.write(g.haystack(r.choice([4096, 65536, 300000])))


if __name__ == '__main__':
    main()
