#!/usr/bin/env bash
# tensorfold tokenize / template: exact outputs, and bad input -> "error: ..." on stderr, a non-zero
# exit and never a crash (exit codes >= 128 are signals).
# Usage: cli_test.sh TENSORFOLD DATA_DIR BUILD_DATA_DIR
set -u
bin=$1 data=$2 bdata=$3
small=$data/small qwen3=$bdata/qwen3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
pass() { :; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

expect_ok() {  # name, expected stdout file, command...
  local name=$1 want=$2
  shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  [ $rc -eq 0 ] || { fail "$name: exit $rc: $(cat "$tmp/err")"; return; }
  cmp -s "$tmp/out" "$want" || fail "$name: output differs: $(head -c 300 "$tmp/out" | od -c | head -5)"
}
expect_error() {  # name, stderr needle, command...
  local name=$1 needle=$2
  shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -eq 0 ]; then fail "$name: exit 0"; return; fi
  if [ $rc -ge 128 ]; then fail "$name: crashed (exit $rc)"; return; fi
  grep -q -- "$needle" "$tmp/err" || fail "$name: stderr lacks '$needle': $(cat "$tmp/err")"
}

# Encode: "Hello world" and the ChatML tokens of the real Qwen3 tokenizer.
printf '{"ids": [9707, 1879]}\n' >"$tmp/w1"
expect_ok encode_json "$tmp/w1" "$bin" tokenize --tokenizer "$qwen3" --text "Hello world" --json
printf '9707 1879\n' >"$tmp/w2"
expect_ok encode_plain "$tmp/w2" "$bin" tokenize --tokenizer "$qwen3" --text "Hello world"
printf '<|im_start|>user\nhi<|im_end|>' >"$tmp/in3"
printf '{"ids": [151644, 872, 198, 6023, 151645]}\n' >"$tmp/w3"
expect_ok encode_file "$tmp/w3" "$bin" tokenize --tokenizer "$qwen3" --text-file "$tmp/in3" --json
printf 'Hello world' >"$tmp/w4"
expect_ok decode "$tmp/w4" "$bin" tokenize --tokenizer "$qwen3" --decode 9707,1879
printf 'user\nhi' >"$tmp/w5"
expect_ok decode_skip "$tmp/w5" "$bin" tokenize --tokenizer "$qwen3" --decode 151644,872,198,6023,151645 --skip-special
printf '{"text": "\\ufffd"}\n' >"$tmp/w6"
"$bin" tokenize --tokenizer "$qwen3" --decode 126 --json >"$tmp/o6" 2>&1 || fail "decode_partial: exit $?"
python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["text"]; sys.exit(0 if t=="\ufffd" else 1)' "$tmp/o6" \
  || fail "decode_partial: $(cat "$tmp/o6")"

# Template: the prompt exactly, no newline added.
cat >"$tmp/msgs.json" <<'JSON'
{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}
JSON
printf '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n' >"$tmp/w7"
expect_ok template_no_think "$tmp/w7" "$bin" template --tokenizer "$qwen3" --messages-file "$tmp/msgs.json" --add-generation-prompt --enable-thinking false
printf '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n' >"$tmp/w8"
expect_ok template_plain "$tmp/w8" "$bin" template --tokenizer "$small" --messages-file "$tmp/msgs.json"
printf '[{"role": "user", "content": "x"}]' >"$tmp/list.json"
printf '<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n' >"$tmp/w9"
expect_ok template_list "$tmp/w9" "$bin" template --tokenizer "$small" --messages-file "$tmp/list.json" --add-generation-prompt --enable-thinking true

# Bad input.
mkdir -p "$tmp/bad_json" "$tmp/empty"
printf '{"model": ' >"$tmp/bad_json/tokenizer.json"
printf '{"chat_template": "{%% if %%}"}' >"$tmp/bad_json/tokenizer_config.json"
expect_error missing_dir "cannot open" "$bin" tokenize --tokenizer "$tmp/nope" --text x
expect_error bad_tokenizer_json "not valid JSON" "$bin" tokenize --tokenizer "$tmp/bad_json" --text x
expect_error no_text "one of --text" "$bin" tokenize --tokenizer "$small"
printf 'ok\xc3(' >"$tmp/bad_utf8"
expect_error invalid_utf8_file "not valid UTF-8" "$bin" tokenize --tokenizer "$small" --text-file "$tmp/bad_utf8"
expect_error invalid_utf8_arg "not valid UTF-8" "$bin" tokenize --tokenizer "$small" --text "$(printf 'a\xff')"
expect_error missing_text_file "cannot open" "$bin" tokenize --tokenizer "$small" --text-file "$tmp/none.txt"
expect_error decode_not_int "not an integer" "$bin" tokenize --tokenizer "$small" --decode 1,x
expect_error decode_empty_item "not an integer" "$bin" tokenize --tokenizer "$small" --decode 1,,2
expect_error decode_out_of_range "not in the vocabulary" "$bin" tokenize --tokenizer "$small" --decode 99999999
expect_error bad_template "syntax" "$bin" template --tokenizer "$tmp/bad_json" --messages-file "$tmp/list.json"
expect_error no_template "no chat template" "$bin" template --tokenizer "$tmp/empty" --messages-file "$tmp/list.json"
printf '[{"role": ' >"$tmp/broken.json"
expect_error bad_messages_json "not valid JSON" "$bin" template --tokenizer "$small" --messages-file "$tmp/broken.json"
printf '[{"role": "user", "content": "\xff"}]' >"$tmp/bad_utf8.json"
expect_error messages_invalid_utf8 "not valid JSON" "$bin" template --tokenizer "$small" --messages-file "$tmp/bad_utf8.json"
printf '{"messages": 3}' >"$tmp/not_list.json"
expect_error messages_not_list "must be a JSON list" "$bin" template --tokenizer "$small" --messages-file "$tmp/not_list.json"
printf '[{"role": "assistant", "content": null}]' >"$tmp/null_content.json"
expect_error template_raises "not iterable" "$bin" template --tokenizer "$small" --messages-file "$tmp/null_content.json"
expect_error bad_thinking_flag "enable-thinking" "$bin" template --tokenizer "$small" --messages-file "$tmp/list.json" --enable-thinking maybe

if [ $fails -eq 0 ]; then echo "tokenizer CLI: all checks passed"; fi
exit $((fails > 0))
