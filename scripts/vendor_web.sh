#!/usr/bin/env bash
# Refresh the web assets the offline pages and lecture decks load (mimo_kit/web/vendor/), from the npm registry.
# Pinned versions; only the files the pages load are kept (licences included). Run from the repository root.
set -euo pipefail
MATHJAX=3.2.2    # MathJax 3: one combined TeX → CommonHTML script, TeX fonts as woff beside it
REVEAL=5.2.1     # reveal.js 5: UMD build (a global Reveal), notes plugin, white theme
REQUIREJS=2.3.7  # require.js: what nbconvert's lab page template loads for widget outputs
out=mimo_kit/web/vendor
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack -q "mathjax@$MATHJAX" "reveal.js@$REVEAL" "requirejs@$REQUIREJS" >/dev/null)
for pkg in mathjax-$MATHJAX reveal.js-$REVEAL requirejs-$REQUIREJS; do
    mkdir -p "$work/$pkg" && tar xzf "$work/$pkg.tgz" -C "$work/$pkg"
done
rm -rf "$out" && mkdir -p "$out"/{mathjax/output/chtml/fonts,reveal/dist/theme/fonts/source-sans-pro,reveal/plugin/notes,requirejs}
m=$work/mathjax-$MATHJAX/package
cp "$m/LICENSE" "$m/es5/tex-chtml-full.js" "$out/mathjax/"
cp -r "$m/es5/output/chtml/fonts/woff-v2" "$out/mathjax/output/chtml/fonts/"
r=$work/reveal.js-$REVEAL/package
cp "$r/LICENSE" "$out/reveal/"
cp "$r/dist/reveal.js" "$r/dist/reveal.css" "$r/dist/reset.css" "$out/reveal/dist/"
cp "$r/dist/theme/white.css" "$out/reveal/dist/theme/"
cp "$r"/dist/theme/fonts/source-sans-pro/{LICENSE,source-sans-pro.css,*.woff} "$out/reveal/dist/theme/fonts/source-sans-pro/"
cp "$r/plugin/notes/notes.js" "$out/reveal/plugin/notes/"
cp "$work/requirejs-$REQUIREJS/package/require.js" "$out/requirejs/"   # its licence (MIT) heads the file
cat > "$out/VERSIONS" <<V
mathjax $MATHJAX (Apache-2.0)
reveal.js $REVEAL (MIT)
requirejs $REQUIREJS (MIT)
V
du -sh "$out"
