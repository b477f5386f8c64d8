#!/usr/bin/env python3
"""make_corpus.py — writes tests/tokenizer/corpus.jsonl, the strings test_tokenizer_vs_js
encodes with both tokenizers. One JSON string per line; combining marks, format and
space characters are written as \\u escapes so that no editor normalizes them away.
Deterministic (fixed seed). Usage: python3 tests/tokenizer/make_corpus.py

Left out on purpose, where HF `tokenizers` (which ls_tok follows) and transformers.js
differ: U+0085 and U+FEFF (\\s differs), 'ſ' right after an apostrophe ((?i) folding),
and a combining U+0338 right after an added token (NFC would join it with the '>').
"""
import json
import os
import random
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))

C_CODE = '''#include <stdio.h>

static int add(int a, int b) { return a + b; }

int main(int argc, char **argv) {
\tfor (int i = 0; i < argc; i++)
\t\tprintf("%d: %s\\n", i, argv[i]);
\treturn add(1, 2) == 3 ? 0 : 1;
}
'''
PY_CODE = '''def fib(n: int) -> int:
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


if __name__ == "__main__":
    print([fib(i) for i in range(10)])  # [0, 1, 1, 2, ...]
'''
JSON_CODE = '''{
  "name": "longstraw",
  "version": "0.1.0",
  "layers": [
    {"type": "linear_attention", "heads": 16},
    {"type": "full_attention", "heads": 32, "rope_theta": 1e7}
  ],
  "enabled": true,
  "ratio": 0.75
}'''
JSON4 = '{\n    "a": {\n        "b": [1, 2, 3],\n        "c": null\n    }\n}\n'
RUST = 'fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!("{:?}", v);\n}\n'
SHELL = '#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do\n  wc -l "$f" | awk \'{print $1}\'\ndone\n'
MAKE = 'all: main\n\nmain: main.o util.o\n\t$(CC) $(CFLAGS) -o $@ $^ -lm\n\n%.o: %.c\n\t$(CC) -c $<\n'
HTML = '<!DOCTYPE html>\n<html lang="en">\n  <body>\n    <p class="x">Hello &amp; welcome!</p>\n  </body>\n</html>\n'
SQL = "SELECT id, name FROM users WHERE age >= 18 AND name LIKE 'A%' ORDER BY id DESC LIMIT 10;"
DIFF = '--- a/file.c\n+++ b/file.c\n@@ -1,3 +1,4 @@\n int x;\n-int y;\n+int y = 0;\n+int z;\n'
MD = '| col A | col B |\n|-------|------:|\n| 1     |   2.5 |\n\n* item\n  * nested item\n\n```python\nx = 1\n```\n'
LATEX = r'\begin{equation} E = mc^2 \quad \int_0^\infty e^{-x^2}\,dx = \frac{\sqrt{\pi}}{2} \end{equation}'

FIXED = [
    # English, contractions in various cases
    "Hello, world!", "hello world", "Hello World", "HELLO WORLD",
    "I'm here, you're there, they've gone, we'll see, she'd know, it's fine, isn't it?",
    "I'M HERE, YOU'RE THERE, THEY'VE GONE, WE'LL SEE, SHE'D KNOW, IT'S FINE",
    "I'm I'M i'M You'Re YOU'rE they'VE We'Ll WE'lL he'D HE'd",
    "don't DON'T Don'T can't've y'all 'twas 'Tis rock'n'roll O'Neil's",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D", "''s' 's's 'x 'r 'l 'v", "It’s a curly apostrophe: don’t",
    "the cat's toy and the cats' toys", "John's, Mary's and the Joneses' house",
    "The quick brown fox jumps over the lazy dog.",
    "A sentence with    multiple     spaces.", "Ends with spaces   ", "   starts with spaces",
    "tabs\tbetween\twords", "\tleading tab", "trailing tab\t", "mixed \t \t whitespace",
    # whitespace runs
    " ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\n\n", "\n\n\n\n", " \n", "\n ", " \n ", "  \n  ",
    "a\nb", "a\n\nb", "a\r\nb", "a\r\n\r\nb", "line one\nline two\n", "a \nb", "a  \n  b", "a\t\n\tb",
    "x" + " " * 40 + "y", "x" + "\t" * 12 + "y", " " * 100, "\n" * 30, "a" + " \n" * 10 + "b",
    "trailing newline\n", "\u000b\u000c vertical tab and form feed", "a\u00a0b non-breaking space",
    "\u3000ideographic space\u3000", "em\u2003space and thin\u2009space", "line\u2028separator\u2029para",
    "zero\u200bwidth\u200cjoiners\u200d", "word \u00a0\u00a0 nbsp run", "\r\r\r", " \r\n \r\n ",
    "end with crlf\r\n", "  \t\n\t  \n", "!\n\n", "x)\n\n\ny", "}\r\n", ";\n  ", "\u00a0\n",
    # numbers
    "1234567890", "12345678901234567890123456789", "3.14159265358979", "1,000,000", "$1,234.56",
    "-42", "+7", "1e-10", "6.022e23", "0x1F 0b1010 0o777", "2024-01-15T08:30:00Z", "192.168.0.1",
    "v1.2.3-rc.4", "50%", "1/2 + 3/4 = 5/4", "٣٤٥ Arabic-Indic digits", "१२३ Devanagari digits",
    "Ⅻ Roman numeral", "½ ¼ ¾ fractions", "x² + y³ = z⁴", "１２３ full-width digits", "① ② ③",
    "phone: +1 (555) 123-4567", "00000000", "3.", ".5", "1.2.3.4.5",
    # accents: precomposed vs decomposed (NFC)
    "café", "cafe\u0301", "CAFE\u0301", "naïve", "nai\u0308ve", "résumé", "re\u0301sume\u0301",
    "Ångström", "A\u030angstro\u0308m", "\u212bngstr\u00f6m (Angstrom sign)", "\u2126 ohm sign",
    "ñ n\u0303 Ñ N\u0303", "Tiếng Việt", "Tie\u0302\u0301ng Vie\u0323\u0302t", "Tie\u0301\u0302ng Vie\u0302\u0323t",
    "e\u0323\u0302 vs e\u0302\u0323", "o\u031b\u0303 o\u0303\u031b", "Straße STRASSE", "ﬁnance ﬂow (ligatures)",
    "Ελληνικά: άλφα, ά (decomposed α\u0301), ῷ ω\u0342\u0345", "\u1f80 \u03b1\u0313\u0300\u0345",
    "Ź ż ł ą ę ć ń ó ś", "Z\u0301 z\u0307 a\u0328", "\u0915\u093c \u0958 nukta (composition exclusion)",
    "\u05e9\u05c1\u05bc Hebrew points \u05e9\u05bc\u05c1", "a\u0301\u0301\u0301 stacked", "\u0301 leading mark",
    "x\u0327\u0301 q\u0307\u0323", "a ≮ b and a <\u0338 b", "≠ =\u0338", "ḱ k\u0301", "\u0041\u030a\u0301",
    "Đ đ Ħ ħ Ŧ ŧ", "ǅ ǈ ǋ titlecase digraphs", "İstanbul ıi", "\u00c5\u0301 \u01fa",
    # CJK
    "你好，世界！", "我爱自然语言处理。", "今天天气很好，我们去公园散步吧。", "中華民國 繁體中文測試",
    "こんにちは、世界！", "ひらがな カタカナ 漢字", "東京都渋谷区に住んでいます。", "ｶﾀｶﾅ half-width katakana",
    "ガ か\u3099 パ は\u309a (kana voicing marks)", "안녕하세요, 세계!", "한국어 형태소 분석",
    "\u1100\u1161\u11a8 \u1112\u1161\u11ab (conjoining jamo)", "\u1100\u1161 \u110b\u1175\u11bc", "각\u11a8",
    "中文English混合text测试", "日本語とEnglishと한국어", "数字123和字母abc", "（全角括弧）「引用」『二重』",
    "《书名》——破折号……省略号", "ａｂｃ ＡＢＣ full-width latin", "〇一二三四五六七八九十百千万億",
    # emoji
    "👍", "👍🏽", "👍🏿👍🏻", "👨\u200d👩\u200d👧\u200d👦 family", "🏳\ufe0f\u200d🌈 rainbow flag",
    "🧑🏿\u200d💻 technologist", "🇯🇵🇺🇸🇩🇪 flags", "1\ufe0f\u20e3 #\ufe0f\u20e3 keycaps", "❤\ufe0f ❤ ♥",
    "I love 🍕 and 🍣!", "emoji😀without😃spaces", "🎉🎉🎉 party", "👩🏽\u200d🔬 👨🏻\u200d🚀",
    "😂😂😂😂😂😂😂😂😂😂", "test ✅ done ❌ failed ⚠\ufe0f warning", "🤷\u200d♀\ufe0f", "😀 😃 😄 😁",
    # mixed scripts
    "Привет, мир! Как дела?", "ПРИВЕТ мир", "مرحبا بالعالم", "שלום עולם", "สวัสดีชาวโลก",
    "नमस्ते दुनिया", "Γειά σου Κόσμε", "გამარჯობა", "Բարեւ աշխարհ", "Hello мир 世界 🌍",
    "Ṫḧë qüïċḱ ḃṛöẅṅ ḟöẍ", "Ẓ̌ zalgo-ish t\u0336e\u0336x\u0336t", "ʎʇɹoʍ oʃʃǝɥ", "ĀāĒēĪīŌōŪū",
    "àéîõü ÀÉÎÕÜ", "Ææ Øø Åå Þþ Ðð", "ℕ ℤ ℚ ℝ ℂ", "→ ← ↑ ↓ ⇒ ∀x ∃y", "∑ ∏ ∫ √ ∞ ≈ ≤ ≥",
    # special tokens (Qwen added tokens)
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nLet me think about this.\n</think>\n\nThe answer is 42.", "<think></think>",
    "text<|endoftext|>more text", "<|im_start|><|im_end|><|im_start|>", "  <|im_end|>  ", "\n<|im_end|>\n",
    "<|im_start", "<|im_start|>>", "<<|endoftext|>", "<|im_end|", "|im_end|>", "< |im_end| >",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "<tool_response>sunny, 21°C</tool_response>", "<|vision_start|><|image_pad|><|vision_end|>",
    "<|fim_prefix|>def f(x):<|fim_suffix|>    return y<|fim_middle|>", "<|repo_name|>longstraw<|file_sep|>main.c",
    "<|box_start|>(10,20),(30,40)<|box_end|>", "<think>思考中……</think>答案是：是的。", "<think> </think>",
    "<|endoftext|><|endoftext|>", "a<think>b</think>c", "<THINK>not special</THINK>", "<|IM_START|>",
    # punctuation, symbols, urls
    "!!!???...", "Wait... what?!", "—em dash– en dash-hyphen", "«guillemets» „quotes“ “smart” ‘single’",
    "¿Qué tal? ¡Muy bien!", "#hashtag @mention $VAR %PATH% ^caret &amp; *star*", "C++ C# F# .NET",
    "a->b a=>b a<=b a>=b a!=b a==b a===b", "x += 1; y -= 2; z *= 3;", "~/.config/longstraw/config.json",
    "https://example.com/path?query=1&other=two#frag", "user@example.com", "C:\\Windows\\System32",
    "----------", "==========", "**********", "__init__", "foo_bar_baz", "camelCaseWord", "PascalCase",
    "snake_case_123", "kebab-case-word", "ALLCAPS_WITH_NUMBERS_42", "[1, 2, 3]", "{'a': 1}", "(x)",
    "()" * 20, "<>" * 10, "\\n\\t\\r literal escapes", "\"quoted\"", "'single'", "`backtick`",
    "\u0001\u0002\u0003 control chars", "del\u007fchar", "\u0080\u0081\u009f C1 controls", "\u00ad soft hyphen",
    "tab\u00a0\tnbsp", "∂f/∂x", "°C °F", "™ © ®", "§1 ¶2", "€100 £50 ¥1000 ₹500 ₿",
    # code
    C_CODE, PY_CODE, JSON_CODE, JSON4, RUST, SHELL, MAKE, HTML, SQL, DIFF, MD, LATEX,
    "    indented with four spaces", "\t\tindented with tabs", "if (x) {\n    y();\n}\n", "x = [\n  1,\n  2,\n]",
    "def f():\n\tpass\n", "    \n    \n", "}\n\n\n\nint", "  # comment\n  x = 1  # trailing\n",
    "print('hello')\r\nprint('world')\r\n", "#define MAX(a, b) ((a) > (b) ? (a) : (b))",
    "SELECT * FROM t;\n\n-- comment\n", "<div>\n\t<span>x</span>\n</div>", "a\n\tb\n\t\tc\n\t\t\td",
    # long runs
    "a" * 200, "ab" * 100, "abc " * 50, "9" * 120, "1234567890" * 12, "." * 80, "-" * 100, "=" * 64,
    "😀" * 40, "中" * 60, "é" * 50, "e\u0301" * 30, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab",
    "QmFzZTY0IGVuY29kZWQgdGV4dCBmb3IgdGVzdGluZyB0aGUgdG9rZW5pemVyIG9uIGxvbmcgYmFzZTY0IGJsb2Jz",
    "0123456789abcdef" * 8, "Supercalifragilisticexpialidocious", "Pneumonoultramicroscopicsilicovolcanoconiosis",
    "",
]

FRAGMENTS = [
    "the", " the", "The", "THE", "hello", " world", "I'm", "don't", "'s", "'LL", "'Re", "  ", " ", "\t",
    "\n", "\r\n", "\n\n", "   \n", "123", "4", "3.14", "1,000", "٣", "½", "Ⅻ", "你好", "世界", "。", "，",
    "こんにちは", "カタカナ", "한국어", "안녕", "Привет", "мир", "مرحبا", "שלום", "नमस्ते", "สวัสดี",
    "café", "cafe\u0301", "e\u0302\u0323", "A\u030a", "\u212b", "👍🏽", "👨\u200d👩\u200d👧", "🇯🇵", "😀",
    "❤\ufe0f", "!", "?", "...", "(", ")", "{", "}", "[", "]", ";", ":", "\"", "'", "`", "->", "==", "+=",
    "#", "@", "$", "%", "&", "*", "/", "\\", "|", "_", "-", "~", "^", "<", ">", "<|im_start|>",
    "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "\u00a0", "\u3000", "\u2003", "x", "Y", "z9",
    "snake_case", "CamelCase", "ALLCAPS", "α", "Ω", "ß", "ﬁ", "İ", "ı", "ǅ", "\u0301", "\u0308", "\u200b",
]


def escape_line(s):
    out = []
    for ch in json.dumps(s, ensure_ascii=False)[1:-1]:
        cat = unicodedata.category(ch)
        if ch != " " and (cat[0] in "MCZ"):
            b = ch.encode("utf-16-be")
            out.extend("\\u%02x%02x" % (b[i], b[i + 1]) for i in range(0, len(b), 2))
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def main():
    rng = random.Random(20240607)
    lines = list(FIXED)
    for _ in range(160):
        k = rng.randint(2, 14)
        lines.append("".join(rng.choice(FRAGMENTS) for _ in range(k)))
    bad = [s for s in lines if "\u0085" in s or "\ufeff" in s or "'\u017f" in s]
    assert not bad, bad
    path = os.path.join(HERE, "corpus.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for s in lines:
            e = escape_line(s)
            assert json.loads(e) == s
            f.write(e + "\n")
    print("wrote %s: %d strings" % (path, len(lines)))


if __name__ == "__main__":
    main()
