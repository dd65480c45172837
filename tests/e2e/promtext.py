"""A strict reader of the Prometheus text exposition format (0.0.4), as node_exporter's textfile
collector reads *.prom files, plus the rules gpushim promises on top (docs/metrics-and-snapshots.md).

parse(text) returns {family name: Family}; any deviation raises PromFormatError with the line.
Stricter than Prometheus where gpushim promises more: no timestamps (node_exporter rejects them),
no blank or free comment lines, HELP before TYPE before the samples, each family once and
contiguous, counters named *_total, every name prefixed gpushim_.
"""
import math
import re

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


class PromFormatError(ValueError):
    pass


class Family:
    def __init__(self, name):
        self.name = name
        self.help = None
        self.type = None
        self.samples = []  # (labels dict, float value)

    def value(self, **labels):
        """The value of the one sample whose labels include `labels` (all given as strings)."""
        want = {k: str(v) for k, v in labels.items()}
        found = [v for l, v in self.samples if all(l.get(k) == x for k, x in want.items())]
        if len(found) != 1:
            raise KeyError(f"{self.name}: {len(found)} samples match {want}: {self.samples}")
        return found[0]


def _unescape_help(s, line):
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if c == "\\":
            if i + 1 >= len(s) or s[i + 1] not in "\\n":
                raise PromFormatError(f"bad escape in HELP: {line!r}")
            out.append("\\" if s[i + 1] == "\\" else "\n")
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _parse_labels(s, i, line):
    """Parses '{...}' starting at s[i] == '{'; returns (labels, index after '}')."""
    labels = {}
    i += 1
    while True:
        if i < len(s) and s[i] == "}":
            return labels, i + 1
        m = LABEL_NAME.match(s, i)
        if not m:
            raise PromFormatError(f"bad label name: {line!r}")
        name = m.group(0)
        if name.startswith("__"):
            raise PromFormatError(f"reserved label name {name}: {line!r}")
        if name in labels:
            raise PromFormatError(f"label {name} twice: {line!r}")
        i = m.end()
        if s[i:i + 2] != '="':
            raise PromFormatError(f"expected =\" after label {name}: {line!r}")
        i += 2
        value = []
        while True:
            if i >= len(s):
                raise PromFormatError(f"unterminated label value: {line!r}")
            c = s[i]
            if c == '"':
                i += 1
                break
            if c == "\\":
                if i + 1 >= len(s) or s[i + 1] not in '\\"n':
                    raise PromFormatError(f"bad escape in label value: {line!r}")
                value.append({"\\": "\\", '"': '"', "n": "\n"}[s[i + 1]])
                i += 2
                continue
            value.append(c)
            i += 1
        labels[name] = "".join(value)
        if i < len(s) and s[i] == ",":
            i += 1
            continue
        if i < len(s) and s[i] == "}":
            return labels, i + 1
        raise PromFormatError(f"expected , or }} in labels: {line!r}")


def _parse_value(s, line):
    if s in ("NaN", "+Inf", "-Inf", "Inf"):
        return float(s.replace("Inf", "inf").replace("NaN", "nan"))
    if not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", s):
        raise PromFormatError(f"bad value {s!r}: {line!r}")
    v = float(s)
    if math.isinf(v):
        raise PromFormatError(f"value overflows: {line!r}")
    return v


def parse(data):
    """Parses a whole file (bytes or str). Raises PromFormatError."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise PromFormatError(f"not UTF-8: {e}")
    if not data:
        raise PromFormatError("empty file")
    if not data.endswith("\n"):
        raise PromFormatError("does not end with a newline (truncated?)")
    if "\r" in data:
        raise PromFormatError("carriage return in file")
    families = {}
    current = None  # the family whose samples may follow
    closed = set()  # families whose block ended
    for line in data[:-1].split("\n"):
        if line == "":
            raise PromFormatError("blank line")
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) < 3 or parts[0] != "#" or parts[1] not in ("HELP", "TYPE"):
                raise PromFormatError(f"comment that is not HELP or TYPE: {line!r}")
            kind, name = parts[1], parts[2]
            if not METRIC_NAME.fullmatch(name):
                raise PromFormatError(f"bad metric name: {line!r}")
            if kind == "HELP":
                if name in families:
                    raise PromFormatError(f"second HELP for {name} (family repeated or HELP after TYPE)")
                if current is not None:
                    closed.add(current.name)
                fam = families[name] = Family(name)
                fam.help = _unescape_help(parts[3] if len(parts) > 3 else "", line)
                current = fam
            else:
                if current is None or current.name != name or current.type is not None or current.samples:
                    raise PromFormatError(f"TYPE not right after its HELP: {line!r}")
                if len(parts) != 4 or parts[3] not in TYPES:
                    raise PromFormatError(f"bad TYPE: {line!r}")
                current.type = parts[3]
            continue
        m = METRIC_NAME.match(line)
        if not m:
            raise PromFormatError(f"bad sample line: {line!r}")
        name = m.group(0)
        i = m.end()
        labels = {}
        if i < len(line) and line[i] == "{":
            labels, i = _parse_labels(line, i, line)
        if i >= len(line) or line[i] != " ":
            raise PromFormatError(f"expected a space before the value: {line!r}")
        rest = line[i + 1:].split(" ")
        if len(rest) != 1:
            raise PromFormatError(f"timestamps or trailing fields are not allowed: {line!r}")
        value = _parse_value(rest[0], line)
        if current is None or name != current.name or current.type is None:
            raise PromFormatError(f"sample outside its family's block (or before TYPE): {line!r}")
        key = tuple(sorted(labels.items()))
        if any(tuple(sorted(l.items())) == key for l, _ in current.samples):
            raise PromFormatError(f"duplicate series: {line!r}")
        current.samples.append((labels, value))
    for fam in families.values():
        if fam.type is None:
            raise PromFormatError(f"{fam.name} has no TYPE")
        if not fam.samples:
            raise PromFormatError(f"{fam.name} has no samples")
        if not fam.name.startswith("gpushim_"):
            raise PromFormatError(f"{fam.name} lacks the gpushim_ prefix")
        if (fam.type == "counter") != fam.name.endswith("_total"):
            raise PromFormatError(f"{fam.name}: counters, and only counters, end in _total")
        if fam.type == "counter" and any(v < 0 or v != int(v) for _, v in fam.samples):
            raise PromFormatError(f"{fam.name}: a counter must be a non-negative integer")
    return families
