#!/usr/bin/env python3
"""IDS-like regexes built from the haystack's own words, so that their factors
are common there (the harsh case for factor gating; bench/gen_shapes.py's ids
shapes use words the haystack lacks).

    bench/gen_wordy_ids.py N SEED [WORDS_FILE] > FILE.rules

WORDS_FILE defaults to tests/data/rebar/haystacks/sherlock.txt; words of 4 to
10 letters, lower case. docs/PERFORMANCE.md "Session 34".
"""
import os
import random
import sys

rnd = random.Random(int(sys.argv[2]))
n = int(sys.argv[1])
src = sys.argv[3] if len(sys.argv) > 3 else os.path.join(
    os.path.dirname(__file__), '..', 'tests', 'data', 'rebar', 'haystacks', 'sherlock.txt')
words = []
with open(src, errors='ignore') as f:
    for w in f.read().split():
        w = ''.join(ch for ch in w if ch.isalpha()).lower()
        if 4 <= len(w) <= 10: words.append(w)
words = sorted(set(words))
def W(): return rnd.choice(words)
def hexb(): return '\\x%02x' % rnd.randrange(256)
T = [
 lambda: f"/{W()}\\s+{W()}/i",
 lambda: f"/{W()}[^\\n]{{0,{rnd.choice([10,40,100,300])}}}{W()}/",
 lambda: f"/\\/{W()}\\/{W()}\\.(php|asp|jsp)\\?[a-z_]{{2,12}}=/i",
 lambda: f"/{W()}[0-9]{{{rnd.randint(2,6)},{rnd.randint(7,12)}}}/",
 lambda: f"/\\b{W()}_[A-Za-z0-9]{{{rnd.choice([16,20,32,40])}}}\\b/",
 lambda: f"/{W()}.{{0,{rnd.choice([20,64,200])}}}{W()}/s",
 lambda: f"/{hexb()}{hexb()}{hexb()}.{{{rnd.randint(1,4)},{rnd.randint(5,16)}}}{hexb()}{hexb()}/s",
 lambda: f"/^{W()}:\\s*[^\\r\\n]{{1,{rnd.choice([50,200])}}}$/m",
 lambda: f"/{W()}(=|:)\\s*[\"']?[a-f0-9]{{{rnd.choice([8,16,32])},}}/i",
 lambda: f"/({W()}|{W()}|{W()})\\s+{W()}/",
 lambda: f"/{W()}\\x3a\\x20[^\\x0d\\x0a]*{W()}/i",
 lambda: f"/[a-z]{{3}}\\d{{2}}{W()}/",
]
for i in range(n):
    print(f"{i+1}:{rnd.choice(T)()}")
