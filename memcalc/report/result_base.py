"""The base of every result model: a frozen pydantic model (``memcalc.validated.Result``) that displays as memcalc's
rich tables in a console, Jupyter or IPython (``memcalc.report.view``)."""

from __future__ import annotations

from typing import Any

from memcalc.validated import Result


class _Result(Result):

    # Display: rich consoles call __rich__, Jupyter/IPython call _repr_mimebundle_.
    def __rich__(self) -> Any:
        from memcalc.report.view import render

        return render(self)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from memcalc.report.view import to_text_and_html

        text, html = to_text_and_html(self)
        return {"text/plain": text, "text/html": html}

    def _repr_html_(self) -> str:
        """An HTML fragment of the tables (``memcalc.report.view.HTML_FRAGMENT``), for any HTML front end."""
        from memcalc.report.view import to_text_and_html

        return to_text_and_html(self)[1]
