"""Issue 43: report.html showed raw Markdown (`**...**`, backticks); its inline marks are HTML."""

from __future__ import annotations

import pytest

from vlctl.report.writer import Report, inline_html


@pytest.mark.parametrize(("text", "want"), [
    ("**5 images were not found** under photos/", "<strong>5 images were not found</strong> under photos/"),
    ("Encoder `open_clip:a*b` on 3 <images>", "Encoder <code>open_clip:a*b</code> on 3 &lt;images&gt;"),
    ("a * b * c, 2*3 and *one* word", "a * b * c, 2*3 and <em>one</em> word"),
])
def test_inline_marks_become_html(text, want):
    assert inline_html(text) == want


def test_report_html_has_no_markdown_marks(tmp_path):
    rep = Report("audit")
    rep.text("**2 unreadable files** were skipped: `empty.jpg`")
    rep.table(["word", "accuracy"], [["`red`", 50.0]])
    html = rep.to_html()
    assert "<p><strong>2 unreadable files</strong> were skipped: <code>empty.jpg</code></p>" in html
    assert "<td><code>red</code></td>" in html and "**" not in html and "`" not in html
    assert "**2 unreadable files**" in rep.to_markdown()
