"""Fixed texts that exercise a byte-level BPE: scripts, emoji, combining marks, chat markup, whitespace, digits."""

from __future__ import annotations

SAMPLES = {
    "english": "The quick brown fox jumps over the lazy dog. It's 5 o'clock, isn't it? We'll see, they'd say.",
    "code": ('def fib(n: int) -> int:\n    """Fibonacci, slowly."""\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n'
             '\n\nif __name__ == "__main__":\n\tprint({"a": [1, 2, 3]}, end="\\n")  # done\n'),
    "cjk": "机器学习是人工智能的一个分支。日本語の文章とカタカナ、ひらがな。한국어 문장입니다. 繁體中文測試",
    "emoji": "Emoji: 😀🎉 👍🏽 👨‍👩‍👧‍👦 🇯🇵 ❤️ 🫠 — end",
    "combining": ("Zoë naïve café; decomposed e\u0301 a\u0300 n\u0303 o\u0308\u0304; Devanagari क्षि हिन्दी; "
                  "Thai ภาษาไทย; Arabic العَرَبِيَّة; Hebrew שָׁלוֹם; Vietnamese Tiếng Việt"),
    "chat_markup": ("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n"
                    "<|im_start|>assistant\n<think>\nCall the tool.\n</think>\n\n<tool_call>\n"
                    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
                    '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>\n<|endoftext|>'),
    "whitespace_digits": ("a" + " " * 40 + "b\t\t\t\tc\n\n\n\n  \n   \r\n  0123456789 3.14159265 1,000,000 "
                          "2026-12-04 0x1F600 ١٢٣ ½"),
    "merge_unreachable": "俱乐部 新加坡 毛泽东",
}
"""By name. ``merge_unreachable`` holds Qwen3.5 vocabulary words that no chain of merges builds
(tiktoken, and a BPE with ``ignore_merges``, take them whole)."""

STREAM_TEXT = ("天気がいいですね 😀👍🏽👨‍👩‍👧‍👦 🇯🇵 — e\u0301 क्षि naïve العَرَبِيَّة 俱乐部 "
               "中文标点：“引号”…… 한국어")
"""Multi-byte text whose tokens split characters, for streamed detokenization."""
