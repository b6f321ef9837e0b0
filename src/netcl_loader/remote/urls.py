"""Where data is named: URL schemes, WebDataset's brace ranges, and keeping secrets out of text."""
from __future__ import annotations

import os
import re

__all__ = ["SCHEMES", "scheme_of", "is_remote", "local_path", "names_of", "expand_braces",
           "expand_all", "redact", "Secrets", "protocol_of", "missing_package_error", "unsigned"]

#: URL scheme -> (fsspec protocol, the pip package that provides it).  The
#: HTTP filesystem is fsspec's own, built on aiohttp.
SCHEMES = {
    "http": ("http", "aiohttp"),
    "https": ("https", "aiohttp"),
    "s3": ("s3", "s3fs"),
    "s3a": ("s3", "s3fs"),
    "gs": ("gcs", "gcsfs"),
    "gcs": ("gcs", "gcsfs"),
    "az": ("abfs", "adlfs"),
    "abfs": ("abfs", "adlfs"),
    "abfss": ("abfs", "adlfs"),
}
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
#: A Windows drive letter looks like a one-letter scheme: it is a path.
_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")


def scheme_of(name):
    """The lower-cased scheme of ``name`` (``"file"`` for a plain path).

    Raises ValueError naming the URL for a scheme that is not supported.
    """
    m = _SCHEME.match(name)
    if m is None or _DRIVE.match(name):
        return "file"
    scheme = m.group(1).lower()
    if scheme != "file" and scheme not in SCHEMES:
        raise ValueError(f"{redact(name)}: unknown URL scheme {scheme + '://'!r}; expected a "
                         f"local path, file://, "
                         f"{', '.join(s + '://' for s in SCHEMES)}")
    return scheme


def is_remote(name):
    return scheme_of(name) != "file"


def local_path(name):
    """The path of a local name (a plain path or a ``file://`` URL)."""
    if name[:7].lower() == "file://":
        from urllib.parse import unquote
        rest = name[7:]
        if rest.startswith("localhost/"):
            rest = rest[len("localhost"):]
        return unquote(rest)
    return name


def names_of(values, what, name):
    """The names ``values`` stand for, in order: each str with its brace ranges
    expanded (a local file whose name has braces is taken as it is), local
    paths made absolute, URLs kept as given."""
    if isinstance(values, (str, bytes, os.PathLike)):
        values = [values]
    try:
        items = list(values)
    except TypeError:
        raise TypeError(f"{what}: {name} must be a sequence of file names, got {values!r} "
                        f"(paths or URLs)") from None
    out = []
    for k, v in enumerate(items):
        if isinstance(v, os.PathLike):
            v = os.fspath(v)
        if isinstance(v, bytes):
            out.append(os.fsdecode(os.path.abspath(v)))
            continue
        if not isinstance(v, str):
            raise TypeError(f"{what}: {name}[{k}] is {v!r}, not a file name or a URL (str, "
                            f"bytes or os.PathLike)")
        scheme_of(v)   # an unknown scheme is a ValueError naming it
        if "{" in v and not (not is_remote(v) and os.path.exists(local_path(v))):
            expanded = expand_braces(v)
        else:
            expanded = [v]
        for e in expanded:
            out.append(e if is_remote(e) else os.path.abspath(local_path(e)))
    return out


def protocol_of(scheme):
    return SCHEMES[scheme][0]


def missing_package_error(url, scheme, exc):
    """The ImportError for a scheme whose filesystem package is not installed."""
    package = SCHEMES[scheme][1]
    return ImportError(f"{redact(url)}: reading {scheme}:// URLs needs the package {package!r} "
                       f"(pip install {package}, or pip install 'netcl-loader[remote]'); "
                       f"importing it failed: {exc}")


# --------------------------------------------------------------------------
# Brace ranges, as WebDataset expands them (it uses the braceexpand package):
# {a,b} alternatives (nested), {0..9} and {00..99} numeric ranges (zero-padded
# to the wider bound's width when either bound has a leading zero), an
# optional step {0..10..2}, letter ranges {a..e}; a range from high to low
# counts down.  Differences: an empty brace `{}` and a range without a bound
# are errors here (a pattern that names nothing is a mistake), where
# braceexpand keeps them as text; there are no backslash escapes.

_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.(-?\d+))?$")
_ALPHA_RANGE = re.compile(r"^([A-Za-z])\.\.([A-Za-z])(?:\.\.(-?\d+))?$")


def expand_braces(pattern):
    """The names a WebDataset pattern stands for, in its order (a list of str).

    Raises ValueError naming the pattern for an empty brace ``{}``, an empty
    range, or braces that do not close.
    """
    out = _expand(pattern, pattern)
    if not out:
        raise ValueError(f"{redact(pattern)}: the brace range expands to no name")
    return out


def expand_all(names):
    """Every name of ``names`` with its braces expanded, in order."""
    out = []
    for n in names:
        out.extend(expand_braces(n) if "{" in n else [n])
    return out


def _expand(s, whole):
    start = s.find("{")
    if start < 0:
        if "}" in s:
            raise ValueError(f"{redact(whole)}: a closing brace without its opening one; "
                             f"expected {{a,b}} or a range such as {{000000..000127}}")
        return [s]
    end, parts = _brace_body(s, start, whole)
    head, tails = s[:start], _expand(s[end + 1:], whole)
    out = []
    if parts is None:
        # A one-item brace without a range stays as text, its inside expanded
        # (as braceexpand keeps it).
        for x in _expand(s[start + 1:end], whole):
            out.extend(head + "{" + x + "}" + t for t in tails)
        return out
    for p in parts:
        for x in _expand(p, whole):
            out.extend(head + x + t for t in tails)
    return out


def _brace_body(s, start, whole):
    """``(index of the closing brace, the alternatives)``; alternatives None
    when the brace holds one item that is not a range (kept as text)."""
    depth, items, cur = 0, [], []
    i = start + 1
    while i < len(s):
        c = s[i]
        if c == "{":
            depth += 1
        elif c == "}":
            if depth == 0:
                items.append("".join(cur))
                body = s[start + 1:i]
                if body == "":
                    raise ValueError(f"{redact(whole)}: an empty brace {{}} names nothing; "
                                     f"expected {{a,b}} or a range such as {{000000..000127}}")
                if len(items) == 1:
                    rng = _range(body, whole)
                    return i, rng
                return i, items
            depth -= 1
        elif c == "," and depth == 0:
            items.append("".join(cur))
            cur = []
            i += 1
            continue
        cur.append(c)
        i += 1
    raise ValueError(f"{redact(whole)}: a brace opened at character {start} does not close; "
                     f"expected {{a,b}} or a range such as {{000000..000127}}")


def _range(body, whole):
    m = _RANGE.match(body)
    if m is not None:
        a, b = int(m.group(1)), int(m.group(2))
        step = abs(int(m.group(3))) if m.group(3) else 1
        if step == 0:
            raise ValueError(f"{redact(whole)}: the range {{{body}}} has step 0")
        lo, hi = m.group(1), m.group(2)
        padded = any(len(x.lstrip("-")) > 1 and x.lstrip("-").startswith("0") for x in (lo, hi))
        width = max(len(lo), len(hi)) if padded else 0
        values = range(a, b + 1, step) if a <= b else range(a, b - 1, -step)
        return [str(v).zfill(width) if v >= 0 else "-" + str(-v).zfill(width - 1)
                for v in values]
    m = _ALPHA_RANGE.match(body)
    if m is not None:
        a, b = ord(m.group(1)), ord(m.group(2))
        step = abs(int(m.group(3))) if m.group(3) else 1
        if step == 0:
            raise ValueError(f"{redact(whole)}: the range {{{body}}} has step 0")
        values = range(a, b + 1, step) if a <= b else range(a, b - 1, -step)
        return [chr(v) for v in values]
    if ".." in body and (body.startswith("..") or body.endswith("..")):
        raise ValueError(f"{redact(whole)}: the range {{{body}}} is empty (a bound is "
                         f"missing); expected {{FIRST..LAST}} such as {{000000..000127}}")
    return None


# --------------------------------------------------------------------------
# Secrets

#: Query parameters of signed URLs that carry a signature or a credential.
_SECRET_QUERY = re.compile(r"(?i)(signature|sig|token|credential|key|secret|password|sas|"
                           r"auth|x-amz-security-token|x-goog-signature)")
#: Names of storage options (and environment variables) whose values are secrets.
_SECRET_NAME = re.compile(r"(?i)(secret|token|password|passwd|credential|sas|signature|"
                          r"account_key|access_key|auth|^key$|_key$|apikey|api_key)")
#: Environment variables of the stores' own credential chains.
_SECRET_ENV = re.compile(r"(?i)^(AWS|GOOGLE|GCS|AZURE|AZ)_.*(SECRET|TOKEN|KEY|PASSWORD|SAS|"
                         r"CREDENTIAL)")
#: A shorter value is not looked for in text (it would match at random).
_MIN_SECRET_CHARS = 6


def redact(url):
    """``url`` as it may be shown: no ``user:password@``, no signed query values."""
    if not isinstance(url, str):
        return url
    m = _SCHEME.match(url)
    if m is None:
        return url
    rest = url[m.end():]
    slash = rest.find("/")
    authority = rest if slash < 0 else rest[:slash]
    if "@" in authority:
        rest = "***@" + rest[len(authority.rsplit("@", 1)[0]) + 1:]
    if "?" in rest:
        path, query = rest.split("?", 1)
        parts = []
        for kv in query.split("&"):
            k = kv.split("=", 1)[0]
            parts.append(f"{k}=***" if "=" in kv and _SECRET_QUERY.search(k) else kv)
        rest = path + "?" + "&".join(parts)
    return url[:m.end()] + rest


#: Query parameters that sign a URL (S3's SigV4 and SigV2, GCS's V4 and V2,
#: CloudFront's): the signature and what goes with it, which change each time
#: the URL is signed again (credential, date, expiry) while the object stays.
_SIGNING_QUERY = re.compile(
    r"(?i)^(x-amz-(algorithm|credential|date|expires|signedheaders|signature|security-token)"
    r"|x-goog-(algorithm|credential|date|expires|signedheaders|signature)"
    r"|awsaccesskeyid|googleaccessid|signature|expires|policy|key-pair-id)$")
#: An Azure shared access signature's parameters (``sig`` marks one): short
#: names that are left alone in a URL without ``sig``.
_SAS_QUERY = frozenset({"sv", "ss", "srt", "sp", "se", "st", "spr", "sig", "sr", "si", "sdd",
                        "skoid", "sktid", "skt", "ske", "sks", "skv", "saoid", "suoid", "scid",
                        "ses", "sip"})


def unsigned(url):
    """``url`` without the query parameters that sign it: what names the object
    whatever signature it was given, so that a URL signed again (new signature,
    date, expiry) names the same cache entry.  Other query parameters (a
    version id) are kept, in their order."""
    if "?" not in url:
        return url
    head, query = url.split("?", 1)
    pairs = [kv for kv in query.split("&") if kv]
    keys = [kv.split("=", 1)[0] for kv in pairs]
    sas = any(k.lower() == "sig" for k in keys)
    kept = [kv for kv, k in zip(pairs, keys)
            if not (_SIGNING_QUERY.match(k) or (sas and k.lower() in _SAS_QUERY))]
    return head + ("?" + "&".join(kept) if kept else "")


class Secrets:
    """The secret values a store's options (and the credential variables of the
    environment) hold, to scrub them out of any text shown."""

    __slots__ = ("_values",)

    def __init__(self, storage_options=None):
        values = set()
        _collect(storage_options or {}, values, False)
        for k, v in os.environ.items():
            if _SECRET_ENV.search(k) and v:
                values.add(v)
        self._values = sorted((v for v in values if len(v) >= _MIN_SECRET_CHARS),
                              key=len, reverse=True)

    def scrub(self, text):
        text = str(text)
        for v in self._values:
            if v in text:
                text = text.replace(v, "***")
        return text


def _collect(obj, out, secret):
    if isinstance(obj, dict):
        for k, v in obj.items():
            _collect(v, out, secret or bool(_SECRET_NAME.search(str(k))))
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _collect(v, out, secret)
    elif isinstance(obj, (str, bytes)) and secret:
        out.add(obj.decode("utf-8", "replace") if isinstance(obj, bytes) else obj)
