"""What the admin's own pages add to Django's look."""


class ExtraStyle:
    """The styles of what these admin pages add: a file rather than inline styles (see chatsite/csp.py)."""

    css = {"all": ["admin-extra.css"]}
