"""Fetch Delta Lake's JVM jars from Maven Central into ``.jars/`` (checksummed, cached).

The pip package ``delta-spark`` carries only the Python API; the JVM side lives on Maven Central.
Downloading the two jars once lets every later Spark session start offline.
"""

import hashlib
import pathlib
import sys
import urllib.request

MAVEN = "https://repo1.maven.org/maven2"
JARS = [  # (group path, artifact, version)
    ("io/delta", "delta-spark_2.13", "4.0.0"),
    ("io/delta", "delta-storage", "4.0.0"),
]


def fetch(dest: pathlib.Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for group, artifact, version in JARS:
        name = f"{artifact}-{version}.jar"
        target = dest / name
        url = f"{MAVEN}/{group}/{artifact}/{version}/{name}"
        if target.exists() and target.with_suffix(".jar.sha1").exists():
            if hashlib.sha1(target.read_bytes()).hexdigest() == target.with_suffix(".jar.sha1").read_text().strip():
                continue
        expected = urllib.request.urlopen(url + ".sha1", timeout=60).read().decode().split()[0]
        payload = urllib.request.urlopen(url, timeout=300).read()
        actual = hashlib.sha1(payload).hexdigest()
        if actual != expected:
            sys.exit(f"checksum mismatch for {url}: got {actual}, Maven Central says {expected}")
        target.write_bytes(payload)
        target.with_suffix(".jar.sha1").write_text(expected)
        print(f"fetched {name} ({len(payload)} bytes)")


if __name__ == "__main__":
    fetch(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".jars"))
