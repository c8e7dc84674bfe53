"""Passwords inside URLs (`http://user:PASSWORD@host`) never reach a message, a record or a log.

A URL with credentials comes from the user (--endpoint, --target) and is then quoted by every
layer that fails on it: our own messages, botocore's "Could not connect to the endpoint URL:
\"http://u:PW@...\"", s3fs's listing errors. Rather than clean each call site, the places
where an error becomes text (MicrobenchError.__str__, RecordWriter.finish, the CLI's one line)
pass it through `redact_text`. Stdlib only: core imports nothing of microbench.
"""

from __future__ import annotations

import re

REDACTED = "<redacted>"
# scheme://user:password@ (the user may be empty); the password runs to the last '@' of the URL,
# so a password holding '@', ':' or even an unencoded '/' is hidden whole (the URL parser reads
# `http://bob:SE/CRET@host` as host "bob", port "SE" and a path: it is still a password, and an
# error about that URL must not show it), and stops at whitespace or a quote. A URL whose path
# holds an '@' after a port loses its port and path in the message too: hiding too much is the
# safe side.
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://[^/@:\s'\"]*:)[^\s'\"]*@", re.IGNORECASE)


def redact_text(text: str) -> str:
    """`text` with every URL password replaced by <redacted> (the user name is kept)."""
    if "@" not in text:
        return text
    return _URL_PASSWORD.sub(rf"\g<head>{REDACTED}@", text)
