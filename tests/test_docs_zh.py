"""The Chinese README and guide stay the English ones in another language: the
same examples (tools/sync_guide_examples.py carries them over), the same
commands, the same documents linked, and links inside the guide that land on a
heading.  (The guides' shell examples themselves are run, for both, by
test_docs_examples.py.)"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^( *)```[^\n]*\n(.*?)^\1```[ \t]*$", re.M | re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def read(rel: str) -> str:
    return (ROOT / rel).read_text(encoding="utf-8")


def sh_commands(text: str) -> list[str]:
    """The command lines of the ```sh blocks, without their comments (which
    each README writes in its own language)."""
    out = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, re.M | re.S):
        for line in block.splitlines():
            cmd = re.sub(r"\s+#\s.*$", "", line).strip()
            if cmd:
                out.append(cmd)
    return out


def prose(text: str) -> str:
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation (ASCII and
    full-width alike) dropped, letters of every script kept, spaces to '-'."""
    h = heading.strip().lower().replace("`", "")
    return "".join(c for c in h if c.isalnum() or c in " -_").replace(" ", "-")


def sync_tool():
    spec = importlib.util.spec_from_file_location("sync_guide_examples",
                                                  ROOT / "tools" / "sync_guide_examples.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_both_guides_show_the_same_examples_in_the_same_order():
    tool = sync_tool()
    en, zh = read("docs/GUIDE.md"), read("docs/GUIDE.zh-CN.md")
    en_ex = [en[a:b] for a, b in tool.examples(en)]
    zh_ex = [zh[a:b] for a, b in tool.examples(zh)]
    assert len(en_ex) > 50
    diff = [i for i, (e, z) in enumerate(zip(en_ex, zh_ex, strict=False)) if tool.code_only(e) != tool.code_only(z)]
    assert len(en_ex) == len(zh_ex) and not diff, \
        "the guides' examples differ: python3 tools/sync_guide_examples.py carries them over"


CJK = re.compile(r"[\u4e00-\u9fff]")


def test_the_chinese_guide_writes_the_comments_in_its_examples_in_chinese():
    """Issue 23, item 8: prose comments inside code blocks are translated;
    commands and program output stay as bk prints them."""
    tool = sync_tool()
    en, zh = read("docs/GUIDE.md"), read("docs/GUIDE.zh-CN.md")
    english = []
    counted = 0
    for (a, b), (c, d) in zip(tool.examples(en), tool.examples(zh), strict=True):
        kind = tool._kind(en[a:b])
        for e_line, z_line in zip(en[a:b].split("\n"), zh[c:d].split("\n"), strict=True):
            e_code, e_comment = tool.split_comment(e_line, kind)
            z_code, z_comment = tool.split_comment(z_line, kind)
            assert e_code == z_code
            if e_comment:
                counted += 1
                if not CJK.search(z_comment):
                    english.append(z_line.strip())
    assert counted > 30 and not english, "comments left in English:\n" + "\n".join(english)


def test_the_comment_rule_never_takes_program_output():
    tool = sync_tool()
    session = "```\n$ bk l   # your list\n#  ID        GPUS  MODE\n1  42430cd2  0     shared  # not a comment\n```"
    assert tool.code_only(session) == "```\n$ bk l\n#  ID        GPUS  MODE\n1  42430cd2  0     shared  # not a comment\n```"
    recipe = "```\nbk w start      or run it in a terminal\nGPU  MODEL  UTIL\n```"
    assert tool.code_only(recipe) == "```\nbk w start\nGPU  MODEL  UTIL\n```"
    table = "```\nGPU  MODEL          UTIL  VRAM\n0    Simulated GPU  ?     ?\n```"
    assert tool.code_only(table) == table
    sh = "```sh\n# make it\npython3 build.py   # the archive\n```"
    assert tool.code_only(sh) == "```sh\n#\npython3 build.py\n```"


def test_chinese_wording():
    """Words the guide no longer uses: 私下试用 (it is private mode), 主人 (an
    owner is 属主 or 所有者), 对账 (reconcile is 协调), and envelope outside
    the glossary's gloss."""
    for rel in ("docs/GUIDE.zh-CN.md", "README.zh-CN.md"):
        text = prose(read(rel))
        for word in ("私下试用", "主人", "对账"):
            assert word not in text, f"{rel}: {word}"
        bare = [m.start() for m in re.finditer(r"envelope", text)
                if not re.search(r"(外层结构（envelope）|即 envelope|\| envelope \|)", text[max(0, m.start() - 8):m.end() + 2])]
        assert not bare, f"{rel}: 'envelope' untranslated at {bare}"


def test_the_sync_tool_keeps_the_chinese_comment_of_an_unchanged_command(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "sync_guide_examples.py").write_text((ROOT / "tools" / "sync_guide_examples.py").read_text())
    (tmp_path / "docs" / "GUIDE.md").write_text("# G\n\n```sh\nbk w start    # run it here\nbk w once     # once\n```\n")
    zh = tmp_path / "docs" / "GUIDE.zh-CN.md"
    zh.write_text("# 指南\n\n```sh\nbk w start    # 在这里运行\nbk w         # 旧的\n```\n")
    p = subprocess.run([sys.executable, str(tmp_path / "tools" / "sync_guide_examples.py")], capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr
    assert zh.read_text() == "# 指南\n\n```sh\nbk w start    # 在这里运行\nbk w once     # once\n```\n"


@pytest.mark.slow
def test_the_sync_tool_carries_a_changed_example_and_refuses_a_missing_one(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "tools").mkdir()
    tool_src = (ROOT / "tools" / "sync_guide_examples.py").read_text()
    (tmp_path / "tools" / "sync_guide_examples.py").write_text(tool_src)
    block = "<!-- example: skip why -->\n```\n$ bk l\n{}\n```\n"
    (tmp_path / "docs" / "GUIDE.md").write_text("# G\n\ntext\n\n" + block.format("new") +
                                                "\nmore\n\n```json\n{}\n```\n")
    zh = tmp_path / "docs" / "GUIDE.zh-CN.md"
    zh.write_text("# 指南\n\n文字\n\n```\n$ bk l\nold\n```\n\n更多\n\n```json\n{}\n```\n")

    def run(*args):
        return subprocess.run([sys.executable, str(tmp_path / "tools" / "sync_guide_examples.py"),
                               *args], capture_output=True, text=True)
    assert run("--check").returncode == 1
    assert run().returncode == 0
    assert zh.read_text() == ("# 指南\n\n文字\n\n" + block.format("new") +
                              "\n更多\n\n```json\n{}\n```\n")
    assert run("--check").returncode == 0
    zh.write_text("# 指南\n\n```json\n{}\n```\n")
    p = run()
    assert p.returncode == 2 and "only in GUIDE.md:5" in p.stderr
    assert zh.read_text() == "# 指南\n\n```json\n{}\n```\n"


def test_both_readmes_open_with_the_language_switch():
    assert read("README.md").splitlines()[0] == "English | [简体中文](README.zh-CN.md)"
    assert read("README.zh-CN.md").splitlines()[0] == "[English](README.md) | 简体中文"


def test_the_chinese_readme_gives_the_same_commands():
    en, zh = sh_commands(read("README.md")), sh_commands(read("README.zh-CN.md"))
    assert en, "README.md has no ```sh blocks"
    assert zh == en


def test_the_chinese_readme_links_every_document_the_english_one_does():
    def targets(rel: str) -> set[str]:
        return {t for t in LINK.findall(read(rel)) if not t.startswith(("http", "#"))}
    missing = targets("README.md") - targets("README.zh-CN.md") - {"README.zh-CN.md"}
    assert not missing, f"README.zh-CN.md does not link {sorted(missing)}"
    assert "docs/GUIDE.zh-CN.md" in targets("README.md")


def test_the_chinese_guide_links_every_page_the_english_one_does():
    def targets(rel: str) -> set[str]:
        return {t for t in LINK.findall(prose(read(rel))) if not t.startswith("#")}
    missing = targets("docs/GUIDE.md") - targets("docs/GUIDE.zh-CN.md") - {"GUIDE.zh-CN.md"}
    assert not missing, f"GUIDE.zh-CN.md does not link {sorted(missing)}"


def test_every_link_inside_the_chinese_guide_lands_on_a_heading():
    text = prose(read("docs/GUIDE.zh-CN.md"))
    anchors = {slug(ln.lstrip("#")) for ln in text.splitlines() if re.match(r"#{1,6} ", ln)}
    broken = [t for t in LINK.findall(text) if t.startswith("#") and t[1:] not in anchors]
    assert not broken, f"links to no heading: {broken}"


def test_slug_matches_the_english_guides_own_anchors():
    # the English guide links its headings by hand, so its links check slug()
    text = prose(read("docs/GUIDE.md"))
    anchors = {slug(ln.lstrip("#")) for ln in text.splitlines() if re.match(r"#{1,6} ", ln)}
    links = [t[1:] for t in LINK.findall(text) if t.startswith("#")]
    assert links and all(a in anchors for a in links), [a for a in links if a not in anchors]


def test_the_chinese_guide_has_a_glossary_and_uses_its_terms():
    text = read("docs/GUIDE.zh-CN.md")
    glossary = text.split("## 术语表", 1)[1].split("\n## ", 1)[0]
    rest = prose(text.split("## 术语表", 1)[1].split("\n## ", 1)[1])
    for english, chinese in [("share slot", "份额槽"), ("ledger", "账本"), ("blackout", "封锁时段"),
                             ("monitor", "监控进程"), ("shared / exclusive", "共享 / 独占")]:
        assert re.search(rf"^\| {re.escape(english)}[^|]*\| {re.escape(chinese)}", glossary, re.M), english
        for term in chinese.split(" / "):
            assert term in rest, f"the glossary's {term} is not used in the guide"
