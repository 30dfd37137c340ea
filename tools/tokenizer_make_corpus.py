#!/usr/bin/env python3
"""Assembles the tokenizer test corpus: tests/tokenizer/data/corpus.jsonl (one JSON string a line).

How it was run (Debian 12, once; the output is committed and the tests read only the output):
  apt-get install fortunes fortunes-min fortunes-zh fortunes-ru fortunes-de fortunes-es \
                  fortunes-it fortunes-pl locales
  python3 tools/tokenizer_make_corpus.py --out tests/tokenizer/data/corpus.jsonl

Sources (all on the machine, nothing downloaded): fortune cookies (English, German, Spanish,
Italian, Polish, Russian, Chinese poems), glibc locale definitions (month and day names in Arabic,
Hebrew, Hindi, Bengali, Tamil, Thai, Greek, Japanese, Korean, ... as <Uxxxx> escapes), source files
of several languages under /usr (C, C++, Python, Perl, CMake, shell, JavaScript), and synthetic
lines: random words drawn from script alphabets, emoji ZWJ sequences and skin tones, combining marks,
NFC/NFD pairs, whitespace runs, CR/LF/tab mixes, numbers, contractions, and text with the Qwen added
tokens in it. Random choices use a fixed seed, so a rerun on the same machine gives the same file.

Only characters assigned in Unicode 14 (this Python's unicodedata) are drawn for synthetic text:
the PCRE2 10.42 tables TensorFold uses are Unicode 14, while the references may know newer ones.
"""
import argparse
import glob
import json
import os
import random
import re
import unicodedata

SEED = 20250903
rng = random.Random(SEED)


def read_text(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def fortunes(paths):
    out, seen = [], set()
    for p in paths:
        t = read_text(p)
        if t is None:
            continue
        for chunk in t.split("\n%\n"):
            chunk = chunk.strip("\n")
            if chunk and "\x1b" not in chunk and chunk not in seen:
                seen.add(chunk)
                out.append(chunk)
    return out


def fortune_files(sub=""):
    base = "/usr/share/games/fortunes/" + sub
    files = []
    for p in sorted(glob.glob(base + "*")):
        if os.path.isdir(p) or p.endswith(".dat"):
            continue
        files.append(p)  # plain and .u8 copies; read_text() keeps only valid UTF-8
    return files


def sample_lines(chunks, n, multi_frac):
    out = []
    for _ in range(n):
        c = rng.choice(chunks)
        lines = c.split("\n")
        if rng.random() < multi_frac or len(lines) == 1:
            out.append(c)
        else:
            out.append(rng.choice(lines))
    return out


def locale_strings():
    out = []
    pat = re.compile(r'"((?:<U[0-9A-Fa-f]{4,6}>|[^"<])+)"')
    for loc in ["ar_SA", "he_IL", "hi_IN", "bn_IN", "ta_IN", "th_TH", "el_GR", "ja_JP", "ko_KR",
                "zh_CN", "fa_IR", "ur_PK", "am_ET", "ka_GE", "hy_AM", "ru_RU", "uk_UA", "vi_VN",
                "mr_IN", "ne_NP", "te_IN", "km_KH", "my_MM", "si_LK", "yi_US"]:
        t = read_text("/usr/share/i18n/locales/" + loc)
        if t is None:
            continue
        for m in pat.finditer(t):
            s = re.sub(r"<U([0-9A-Fa-f]{4,6})>", lambda g: chr(int(g.group(1), 16)), m.group(1))
            if any(ord(ch) > 0x7F for ch in s) and "%" not in s:
                out.append(s)
    return sorted(set(out))


def assigned(cp):
    return unicodedata.category(chr(cp)) not in ("Cn", "Cs")


def alphabet(ranges):
    return [chr(c) for a, b in ranges for c in range(a, b + 1) if assigned(c)]


SCRIPTS = {
    "arabic": alphabet([(0x0621, 0x064A)]),
    "arabic_marks": alphabet([(0x064B, 0x0652)]),
    "hebrew": alphabet([(0x05D0, 0x05EA)]),
    "hebrew_marks": alphabet([(0x05B0, 0x05BC)]),
    "devanagari": alphabet([(0x0905, 0x0939)]),
    "devanagari_marks": alphabet([(0x093E, 0x094D)]),
    "cjk": alphabet([(0x4E00, 0x9FA5)]),
    "hiragana": alphabet([(0x3041, 0x3093)]),
    "katakana": alphabet([(0x30A1, 0x30F6)]),
    "hangul": alphabet([(0xAC00, 0xD7A3)]),
    "thai": alphabet([(0x0E01, 0x0E30)]),
    "greek": alphabet([(0x03B1, 0x03C9), (0x0391, 0x03A9)]),
    "cyrillic": alphabet([(0x0430, 0x044F), (0x0410, 0x042F)]),
    "latin_ext": alphabet([(0x00C0, 0x00FF), (0x0100, 0x017F)]),
    "cjk_ext_b": alphabet([(0x20000, 0x2A6DF)]),
}
PUNCT = [" ", " ", " ", ", ", ". ", "، ", "؟ ", "。", "、", "！", "？", "「", "」", "《", "》", "…", "—",
         "·", ":", ";", "(", ")", "«", "»", "¿", "¡", "\u3000"]


def word(script, lo=1, hi=8):
    chars = SCRIPTS[script]
    n = rng.randint(lo, hi)
    w = "".join(rng.choice(chars) for _ in range(n))
    marks = SCRIPTS.get(script + "_marks")
    if marks:
        w = "".join(ch + (rng.choice(marks) if rng.random() < 0.4 else "") for ch in w)
    return w


def synth_script(script, nwords):
    out = []
    for _ in range(nwords):
        out.append(word(script))
        out.append(rng.choice(PUNCT) if rng.random() < 0.3 else " ")
    return "".join(out).strip()


EMOJI_BASE = ["😀", "😂", "🥲", "🤖", "👍", "👋", "🙏", "💪", "🎉", "🔥", "❤️", "✨", "🚀", "🍕", "🐍", "🦀",
              "☕", "⚡", "✅", "❌", "⭐", "🌍", "📦", "🧪", "🧵", "🫠"]
SKIN = ["\U0001F3FB", "\U0001F3FC", "\U0001F3FD", "\U0001F3FE", "\U0001F3FF"]
ZWJ_SEQ = ["👨\u200d👩\u200d👧\u200d👦", "👩\u200d💻", "🧑🏽\u200d🚀", "🏳️\u200d🌈", "🏴\u200d☠️",
           "👩🏿\u200d🤝\u200d👩🏻", "❤️\u200d🔥", "🐻\u200d❄️", "👨🏻\u200d⚕️", "🧔\u200d♂️",
           "🇯🇵", "🇺🇸", "🇩🇪", "🇧🇷", "1️⃣", "#️⃣", "🏴\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F",
           "👍🏽", "✋🏿", "🙋🏼\u200d♀️", "☺\ufe0e", "☺\ufe0f"]


def synth_emoji():
    parts = []
    for _ in range(rng.randint(1, 8)):
        r = rng.random()
        if r < 0.3:
            parts.append(rng.choice(ZWJ_SEQ))
        elif r < 0.5:
            parts.append(rng.choice(["👋", "👍", "🙏", "💪", "🤚", "👏"]) + rng.choice(SKIN))
        elif r < 0.8:
            parts.append(rng.choice(EMOJI_BASE))
        else:
            parts.append(rng.choice(["hello", "ok", "great job", "lol", "see you", "ship it", "好的", "ありがとう"]))
        parts.append(rng.choice(["", " ", " ", "  ", "\n", "!"]))
    return "".join(parts)


COMBINING = [chr(c) for c in range(0x0300, 0x036F + 1)]
NFD_WORDS = ["café", "naïve", "résumé", "Ångström", "crème brûlée", "São Paulo", "Đặng Thị Ngọc Thịnh",
             "Tiếng Việt", "Zürich", "piñata", "façade", "Ελληνικά", "Ψυχή", "한국어", "가나다라", "ﬁle ﬂow",
             "Å Ω K", "\u212b \u2126 \u212a", "\uf900\uf901\uf902", "ǅungla ǈ", "\u1e9b\u0323", "q\u0307\u0323",
             "\u0958\u0959\u095a", "\u2260\u226e", "\u0f73\u0f75", "e\u0301\u0302\u0323", "o\u0308\u0304"]


def synth_combining():
    r = rng.random()
    if r < 0.35:
        w = rng.choice(NFD_WORDS)
        form = rng.choice(["NFC", "NFD", "NFKD", "none"])
        return w if form == "none" else unicodedata.normalize(form, w)
    if r < 0.7:
        base = rng.choice("aeiouAEIOUnNcCyYzZ ")
        return "".join(base + "".join(rng.choice(COMBINING) for _ in range(rng.randint(1, 4)))
                       for _ in range(rng.randint(1, 6)))
    # a lone mark after whitespace or at the start, and mixed order of marks (canonical reordering)
    return rng.choice(["\u0301abc", " \u0308x", "a\u0323\u0301 a\u0301\u0323", "\u0345\u0301 test",
                       "x\u0315\u0300\u05ae\u0300b", "ᄀ\u1161\u11a8 각", "\u1100\u1161", "A\u030a vs \u00c5"])


WS_PIECES = [" ", "  ", "    ", "\t", "\t\t", "\n", "\r\n", "\r", "\n\n", " \n", "\t\n", "\u00a0", "\u3000",
             "\u2028", "\u2029", "\u0085", "\u2003", "\u200b", "\ufeff", "\u180e", "\u000b", "\u000c",
             "\u1680", "\u202f", "\u205f"]


def synth_whitespace():
    parts = []
    for _ in range(rng.randint(1, 10)):
        r = rng.random()
        if r < 0.4:
            parts.append(rng.choice(WS_PIECES) * rng.randint(1, 40 if rng.random() < 0.2 else 3))
        else:
            parts.append(rng.choice(["word", "x", "a b", "if", "}", "123", "字", "é", ".", "--", "'s", "you"]))
    return "".join(parts)


def synth_number():
    r = rng.random()
    if r < 0.25:
        return str(rng.randint(0, 10 ** rng.randint(1, 30)))
    if r < 0.45:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 8)}f}"
    if r < 0.6:
        return f"{rng.randint(1, 999)},{rng.randint(100, 999)},{rng.randint(100, 999)}.{rng.randint(0, 99):02d}"
    if r < 0.75:
        return rng.choice(["٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "²³¹⁴", "½ ¾ ⅓", "Ⅻ ⅷ", "①②③",
                           "𝟘𝟙𝟚", "3.14159265358979", "1e-9", "0x7fffffff", "0b1011", "v1.2.3-rc.4",
                           "2025-09-03T12:34:56Z", "+1 (555) 010-9999", "١٢٣٫٤٥", "४२ रुपये", "第123号"])
    return " ".join(str(rng.randint(0, 99999)) for _ in range(rng.randint(2, 9)))


CONTRACTIONS = ["don't", "DON'T", "I'm", "I'M", "we'll", "We'LL", "they've", "THEY'VE", "she'd", "it's",
                "IT'S", "you're", "YOU'RE", "can't", "won't", "y'all", "rock 'n' roll", "'s", "'t", "'re",
                "'ve", "'m", "'ll", "'d", "''", "'''", "it’s", "don’t", "O'Neil", "l'été", "'S'", "x'Ll"]


def synth_contractions():
    return " ".join(rng.choice(CONTRACTIONS) if rng.random() < 0.6 else rng.choice(
        ["well", "said", "the", "cat", "x", "42", "!", "?", "you"]) for _ in range(rng.randint(1, 10)))


ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
         "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
         "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
         "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
         "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
NEAR = ["<|im_start", "im_end|>", "<|im_end|", "< |im_end|>", "<|IM_END|>", "<think >", "<<think>>",
        "</think", "<|endoftext|", "<tool_call/>", "<|", "|>", "<>", "<|im_start|im_end|>"]


def synth_added():
    parts = []
    for _ in range(rng.randint(1, 8)):
        r = rng.random()
        if r < 0.45:
            parts.append(rng.choice(ADDED))
        elif r < 0.6:
            parts.append(rng.choice(NEAR))
        else:
            parts.append(rng.choice(["user", "assistant", "system", "\n", " ", "Hello!", "  ", "def f():",
                                     "思考中", "{\"name\": \"get\"}", "\n\n", "x", "é"]))
    return "".join(parts)


EDGE = [
    "", " ", "\n", "\x00", "a\x00b", "\x01\x02\x03\x1f\x7f", "\u0080\u0085\u009f", "\ufffd", "\ufffe\uffff",
    "\U0010ffff", "\U000e0001", "\ue000\uf8ff", "\U000f0000", "\u0378", "\u200d", "\u200c\u200d\u2060",
    "\ufeffBOM at start", "\U0001d54f\U0001d552", "𐍈𐌰𐌽𐍃", "𓀀𓀁", "\u0600\u0601 ", "\u061c\u200e\u200f",
    "\u202a\u202b\u202c\u202d\u202e", "ǲ ǅ ǈ ǋ", "ẞ ß SS", "İstanbul ıi", "ﬃ ﬄ", "Ⓐⓑ", "㌀㍻", "ｶﾞ ｷﾞ", "ヷ",
    "𝐀𝐁𝐂 𝒜", "\u00ad soft\u00adhyphen", "tab\there", "cr\ronly", "crlf\r\nend", "a\u2028b\u2029c",
    "'ſ 'S 's", "\u0130\u0131", "\U0001f600" * 20, "a" * 300, " " * 200, "\n" * 50, "\t" * 30 + "x",
    "..." * 40, "!@#$%^&*()_+-=[]{}|;':\",./<>?`~", "\\n\\t\\r", "日本語のテキストと English mixed 한국어도",
    "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Привет, мир!", "Γειά σου Κόσμε",
]


def code_snippets(n):
    patterns = [
        ("/usr/include/c++/12/bits/*.h", 150), ("/usr/include/*.h", 150), ("/usr/include/linux/*.h", 60),
        ("/usr/lib/python3/dist-packages/jinja2/*.py", 80), ("/usr/lib/python3.11/*.py", 150),
        ("/usr/share/perl/5.36/*.pm", 60), ("/usr/share/cmake-3.25/Modules/*.cmake", 80),
        ("/usr/lib/node_modules/npm/lib/**/*.js", 80), (os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "**", "*.cpp"), 40),
        ("/usr/share/bash-completion/completions/*", 60), ("/usr/lib/python3.11/json/*.py", 20),
        ("/usr/include/nlohmann/*.hpp", 20), ("/usr/share/doc/*/examples/*", 20),
    ]
    files = []
    for pat, k in patterns:
        found = sorted(p for p in glob.glob(pat, recursive=True) if os.path.isfile(p))
        rng.shuffle(found)
        files += found[:k]
    texts = [t for t in (read_text(p) for p in files) if t]
    out = []
    while len(out) < n and texts:
        lines = rng.choice(texts).split("\n")
        if len(lines) < 2:
            continue
        i = rng.randrange(len(lines))
        k = rng.choice([1, 1, 2, 3, 5, 8])
        s = "\n".join(lines[i:i + k])
        if s.strip():
            out.append(s)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    english = fortunes([p for p in fortune_files() if "/off/" not in p])
    german = fortunes(fortune_files("de/"))
    spanish = fortunes(fortune_files("es/"))
    italian = fortunes(fortune_files("it/"))
    polish = fortunes(fortune_files("pl/"))
    russian = fortunes(fortune_files("ru/"))
    chinese = fortunes([p for p in fortune_files() if os.path.basename(p).split(".")[0] in
                        ("chinese", "tang300", "song100")])
    loc = locale_strings()

    corpus = []
    corpus += sample_lines(english, 3000, 0.3)
    corpus += code_snippets(2200)
    corpus += sample_lines(german, 300, 0.2) + sample_lines(spanish, 300, 0.2)
    corpus += sample_lines(italian, 200, 0.2) + sample_lines(polish, 200, 0.2)
    corpus += sample_lines(russian, 300, 0.2) + sample_lines(chinese, 400, 0.3)
    corpus += rng.sample(loc, min(len(loc), 700))
    for script, n in [("arabic", 300), ("hebrew", 250), ("devanagari", 300), ("cjk", 250),
                      ("hiragana", 100), ("katakana", 100), ("hangul", 200), ("thai", 100),
                      ("greek", 100), ("cyrillic", 100), ("latin_ext", 100), ("cjk_ext_b", 40)]:
        corpus += [synth_script(script, rng.randint(1, 12)) for _ in range(n)]
    mixes = ["arabic", "hebrew", "devanagari", "cjk", "hangul", "latin_ext", "greek"]
    corpus += [synth_script(rng.choice(mixes), 2) + " " + rng.choice(english).split("\n")[0][:60]
               for _ in range(200)]
    corpus += [synth_emoji() for _ in range(500)]
    corpus += [synth_combining() for _ in range(500)]
    corpus += [synth_whitespace() for _ in range(600)]
    corpus += [synth_number() for _ in range(400)]
    corpus += [synth_contractions() for _ in range(300)]
    corpus += [synth_added() for _ in range(500)]
    corpus += EDGE
    # NFC/NFD pairs of real text: the same sentence in both forms, one after the other.
    for s in rng.sample(german + spanish + italian + polish, 150):
        line = s.split("\n")[0]
        corpus += [unicodedata.normalize("NFC", line), unicodedata.normalize("NFD", line)]

    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        for s in corpus:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")
    print(f"{args.out}: {len(corpus)} lines, {sum(len(s.encode()) for s in corpus)} bytes of text")


if __name__ == "__main__":
    main()
