"""Where stored output lives: a directory (by default `<data_dir>/output`; give replicas a
shared mount), or an S3-compatible bucket (`output_store = "s3://BUCKET/PREFIX"`, with
`output_s3_endpoint` for one that is not AWS's; credentials from the environment, as boto3
finds them: never in fleetd's settings). Keys are fleetd's own (`job/rank-attempt-output/
line.gz`). Every call blocks: callers run them on the Runtime's offload."""

import os
import tempfile
import threading
import urllib.parse

import boto3
import botocore.config
import botocore.exceptions


class FlushRequests:
    """Task outputs a reader waits for, by node: the node's next acquire takes them and seals
    and uploads each one's open chunk (one per Runtime; a node waiting on another replica is not
    asked, and the reader serves what is stored when its wait ends)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._wanted: dict[str, set[str]] = {}

    def want(self, node_id, task_id):
        with self._lock:
            self._wanted.setdefault(node_id, set()).add(task_id)

    def take(self, node_id):
        """The task ids wanted of this node (each handed out once)."""
        with self._lock:
            return sorted(self._wanted.pop(node_id, ()))


class StoreError(Exception):
    """The store did not do it (a full disk, a bucket that refuses): `reason` in words."""


class DirectoryStore:
    """Chunks as files under `root` (written whole: a temporary file, synced, renamed)."""

    def __init__(self, root):
        self.root = root

    def describe(self):
        return f"directory {self.root}"

    def _path(self, key):
        return os.path.join(self.root, key)

    def put(self, key, blob):
        path = self._path(key)
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".chunk-")
        except OSError as exc:
            raise StoreError(exc.strerror or str(exc)) from None
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(blob)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise StoreError(exc.strerror or str(exc)) from None

    def get(self, key):
        try:
            with open(self._path(key), "rb") as fh:
                return fh.read()
        except OSError as exc:
            raise StoreError(exc.strerror or str(exc)) from None

    def delete(self, keys):
        """Remove these keys (and the directories they leave empty); missing ones are fine."""
        for key in keys:
            path = self._path(key)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise StoreError(exc.strerror or str(exc)) from None
            for directory in (os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
                try:
                    os.rmdir(directory)
                except OSError:
                    break


class S3Store:
    """Chunks as objects of an S3-compatible bucket, under `prefix`."""

    def __init__(self, bucket, prefix, endpoint=None, region=None):
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.endpoint = endpoint
        self.client = boto3.client(
            "s3",
            endpoint_url=endpoint or None,
            region_name=region or None,
            config=botocore.config.Config(
                retries={"max_attempts": 3, "mode": "standard"},
                connect_timeout=5,
                read_timeout=30,
            ),
        )

    def describe(self):
        where = f" at {self.endpoint}" if self.endpoint else ""
        return f"bucket s3://{self.bucket}/{self.prefix}{where}"

    def _key(self, key):
        return f"{self.prefix}/{key}" if self.prefix else key

    def put(self, key, blob):
        try:
            self.client.put_object(
                Bucket=self.bucket,
                Key=self._key(key),
                Body=blob,
                ContentType="application/gzip",
            )
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise StoreError(str(exc)) from None

    def get(self, key):
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise StoreError(str(exc)) from None

    def delete(self, keys):
        keys = list(keys)
        for start in range(0, len(keys), 1000):  # S3 deletes at most 1,000 keys a call
            objects = [{"Key": self._key(key)} for key in keys[start : start + 1000]]
            try:
                answer = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True}
                )
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
                raise StoreError(str(exc)) from None
            errors = answer.get("Errors") or []
            if errors:
                raise StoreError(f"{len(errors)} object(s) not deleted: {errors[0]}")


def make_store(settings):
    """The output store the settings name; ValueError when `output_store` is not one."""
    where = settings.output_store
    if not where:
        root = settings.output_dir or os.path.join(os.path.abspath(settings.data_dir), "output")
        return DirectoryStore(root)
    parts = urllib.parse.urlsplit(where)
    if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
        raise ValueError(
            f"output_store {where!r} is not s3://BUCKET/PREFIX (empty: the output_dir directory)"
        )
    return S3Store(
        parts.netloc,
        parts.path,
        settings.output_s3_endpoint or None,
        settings.output_s3_region or None,
    )
