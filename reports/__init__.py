"""dqa.reports: terminal tables, Markdown, self-contained HTML and JUnit XML renderers."""
