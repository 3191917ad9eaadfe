"""S3 transfers (through s3fs's client) that checksum the bytes they move, with parallel parts and a bound on
memory.

Big files move in ``part_size`` parts, several at once; every part in flight holds a slot of one budget per
operation, so at most ``max_bytes_in_flight`` are held in memory, however many files move. Parts are read and
hashed in order, so the checksum is of exactly the bytes sent or received. A multipart upload that fails or
is cancelled (its deadline passed) is aborted on the server before the call returns; one that cannot be
(the server is gone) is aborted when its folder is next deleted.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import functools
import hashlib
import importlib
import logging
import os
import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import IO, Any

from elastrain.durable._private.checkpoint import FileEntry

logger = logging.getLogger("elastrain.durable")
_ABORT_TIMEOUT_S = 15.0
MIN_PART_SIZE = 5 << 20  # S3's smallest part but the last


def s3_storage_options(storage_options: Mapping[str, Any]) -> dict[str, Any]:
    """s3fs options for a store's own client: bodies carry a checksum the server verifies, and are not hashed a
    second time for the request's signature.

    Over https botocore already leaves a body unsigned when its own checksum header covers it; over plain http
    it signs it too, a SHA-256 pass over every byte (a tenth of an upload's time where the CPU is the limit).
    The checksum header (CRC32, see ``S3Transfer``) is itself signed, and the manifest's SHA-256 of the same
    bytes is checked at every restore. Left as set where the options set it, or where checksums are sent only
    when an operation requires them (options, environment or profile): then signing is what covers a body.
    """
    options = dict(storage_options)
    config = dict(options.get("config_kwargs") or {})
    if _checksums_only_when_required(options, config):
        return options
    s3_config = dict(config.get("s3") or {})
    s3_config.setdefault("payload_signing_enabled", False)
    options["config_kwargs"] = {**config, "s3": s3_config}
    return options


def _checksums_only_when_required(options: Mapping[str, Any], config: Mapping[str, Any]) -> bool:
    """botocore's ``request_checksum_calculation`` as the client will resolve it: its config, else the
    environment (``AWS_REQUEST_CHECKSUM_CALCULATION``) or the profile."""
    value = config.get("request_checksum_calculation")
    if value is None:
        try:
            session = importlib.import_module("botocore.session").Session(profile=options.get("profile"))
            value = session.get_config_variable("request_checksum_calculation")
        except Exception:  # an unknown profile fails the client itself; meanwhile keep signing
            return True
    return str(value).lower() == "when_required"


def is_s3(filesystem: Any) -> bool:
    return hasattr(filesystem, "_call_s3") and hasattr(filesystem, "split_path")


class S3Transfer:
    def __init__(self, fs: Any, *, part_size: int, max_bytes_in_flight: int, max_concurrency: int) -> None:
        self.fs = fs
        self.part_size = part_size
        self.slot_count = max(1, max_bytes_in_flight // part_size)
        self.max_concurrency = max_concurrency

    # -- upload ------------------------------------------------------------------------------------------------

    async def upload_tree(self, pairs: list[tuple[str, str]], base: str) -> list[FileEntry]:
        slots = asyncio.Semaphore(self.slot_count)
        results = await gather_bounded(
            [functools.partial(self.upload_file, source, f"{base}/{relative}", slots) for source, relative in pairs],
            self.max_concurrency,
        )
        return [FileEntry(relative, size, digest) for (_, relative), (size, digest) in zip(pairs, results, strict=True)]

    async def upload_file(self, source: str, path: str, slots: asyncio.Semaphore) -> tuple[int, str]:
        bucket, key, _ = self.fs.split_path(path)
        digest = hashlib.sha256()
        checksummed = await self._checksummed()
        with open(source, "rb") as reader:
            if os.fstat(reader.fileno()).st_size < self.part_size:  # one request, within one part's slot
                async with slots:
                    data, checksum = await asyncio.to_thread(_read_hashed, reader, -1, digest, checksummed)
                    await self.fs._call_s3("put_object", Bucket=bucket, Key=key, Body=data, **checksum)
                return len(data), digest.hexdigest()
            upload_id = await self._create(bucket, key)
            parts: list[asyncio.Task[dict[str, Any]]] = []
            size = 0
            try:
                while True:
                    await slots.acquire()
                    chunk, checksum = await asyncio.to_thread(_read_hashed, reader, self.part_size, digest, checksummed)
                    if not chunk:
                        slots.release()
                        break
                    size += len(chunk)
                    part = self._part(bucket, key, upload_id, len(parts) + 1, chunk, checksum, slots)
                    parts.append(asyncio.ensure_future(part))
                    _raise_first_failure(parts)
                done = await asyncio.gather(*parts)
                await self.fs._call_s3(
                    "complete_multipart_upload",
                    Bucket=bucket,
                    Key=key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": done},
                )
            except BaseException:
                await _cancel_all(parts)
                await self.abort(bucket, key, upload_id)
                raise
        return size, digest.hexdigest()

    async def _checksummed(self) -> bool:
        """Whether bodies go with a CRC32 taken here. Only where the client leaves them unsigned, as a store's own
        does (``s3_storage_options``); elsewhere botocore checksums (or signs) them as it is configured to: a
        header set by hand would make it sign over https too."""
        client = await self.fs.set_session()
        config = getattr(getattr(client, "meta", None), "config", None)
        signing = (getattr(config, "s3", None) or {}).get("payload_signing_enabled")
        return signing is False and getattr(config, "request_checksum_calculation", None) != "when_required"

    async def _create(self, bucket: str, key: str) -> str:
        """Start a multipart upload; cancelled meanwhile (a deadline), it is still aborted once it exists: the
        server may have created it although the answer never arrived."""
        creating = asyncio.ensure_future(self.fs._call_s3("create_multipart_upload", Bucket=bucket, Key=key))
        try:
            answer = await asyncio.shield(creating)
        except asyncio.CancelledError:
            try:
                answer = await asyncio.wait_for(creating, _ABORT_TIMEOUT_S)
            except BaseException:
                raise asyncio.CancelledError from None  # it never got an id: nothing to abort
            await self.abort(bucket, key, answer["UploadId"])
            raise
        upload_id: str = answer["UploadId"]
        return upload_id

    async def _part(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        number: int,
        chunk: bytes,
        checksum: dict[str, str],
        slots: asyncio.Semaphore,
    ) -> dict[str, Any]:
        try:
            answer = await self.fs._call_s3(
                "upload_part", Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=chunk, **checksum
            )
            return {"PartNumber": number, "ETag": answer["ETag"]}
        finally:
            slots.release()

    async def abort(self, bucket: str, key: str, upload_id: str) -> None:
        """Abort on the server, bounded: this also runs when the caller's deadline already passed."""
        try:
            await asyncio.wait_for(
                self.fs._call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id),
                _ABORT_TIMEOUT_S,
            )
        except BaseException as error:  # reported; deleting the folder later aborts it again
            reason = type(error).__name__
            logger.warning("Could not abort the multipart upload of s3://%s/%s (%s).", bucket, key, reason)

    async def abort_open_uploads(self, path: str) -> None:
        """Abort multipart uploads left open under ``path`` (their parts are stored and billed until then)."""
        bucket, key, _ = self.fs.split_path(path)
        prefix = key.rstrip("/") + "/" if key else ""
        listing = await self.fs._call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix)
        for upload in listing.get("Uploads", []):
            await self.abort(bucket, upload["Key"], upload["UploadId"])

    # -- download ----------------------------------------------------------------------------------------------

    async def download_tree(self, files: list[tuple[str, int, str]]) -> list[tuple[int, str]]:
        """``files``: (object path, size, local target) each; the size and SHA-256 of what was written."""
        slots = asyncio.Semaphore(self.slot_count)
        return await gather_bounded(
            [functools.partial(self.download_file, path, size, target, slots) for path, size, target in files],
            self.max_concurrency,
        )

    async def download_file(self, path: str, size: int, target: str, slots: asyncio.Semaphore) -> tuple[int, str]:
        bucket, key, _ = self.fs.split_path(path)
        digest = hashlib.sha256()
        written = 0
        ranges = [(start, min(start + self.part_size, size) - 1) for start in range(0, size, self.part_size)]
        pending: collections.deque[asyncio.Task[bytes]] = collections.deque()
        with open(target, "wb") as writer:
            try:
                for first, last in ranges or [(0, -1)]:
                    # Never wait for a slot while holding finished parts: write them first (no deadlock between
                    # files sharing the budget).
                    while pending and (pending[0].done() or slots.locked()):
                        written += await self._write_next(pending, writer, digest, slots)
                    await slots.acquire()
                    pending.append(asyncio.ensure_future(self._get(bucket, key, first, last, slots)))
                while pending:
                    written += await self._write_next(pending, writer, digest, slots)
            except BaseException:
                await _cancel_all(list(pending))
                raise
            await asyncio.to_thread(writer.flush)
        return written, digest.hexdigest()

    async def _get(self, bucket: str, key: str, first: int, last: int, slots: asyncio.Semaphore) -> bytes:
        try:
            extra = {"Range": f"bytes={first}-{last}"} if last >= first else {}
            answer = await self.fs._call_s3("get_object", Bucket=bucket, Key=key, **extra)
            body = answer["Body"]
            try:
                data: bytes = await body.read()
            finally:
                body.close()
            return data
        except BaseException:
            slots.release()  # _write_next never sees a failed part
            raise

    @staticmethod
    async def _write_next(
        pending: collections.deque[asyncio.Task[bytes]], writer: IO[bytes], digest: Any, slots: asyncio.Semaphore
    ) -> int:
        data = await pending[0]
        pending.popleft()
        try:
            await asyncio.to_thread(_write_hashed, writer, data, digest)
        finally:
            slots.release()
        return len(data)


async def gather_bounded(calls: Sequence[Callable[[], Awaitable[Any]]], limit: int) -> list[Any]:
    """Run the calls, ``limit`` at a time, results in order; the first error cancels the rest, which are waited
    for (their clean-up, such as aborting an upload, happens before this returns)."""
    semaphore = asyncio.Semaphore(limit)

    async def one(call: Callable[[], Awaitable[Any]]) -> Any:
        async with semaphore:
            return await call()

    tasks = [asyncio.ensure_future(one(call)) for call in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        await _cancel_all(tasks)
        raise


async def _cancel_all(tasks: list[Any]) -> None:
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


def _raise_first_failure(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


def _read_hashed(reader: IO[bytes], size: int, digest: Any, checksummed: bool) -> tuple[bytes, dict[str, str]]:
    """The next ``size`` bytes, added to ``digest``; with their CRC32 as the request's checksum where bodies carry
    one. Taken here, in a worker thread, rather than by botocore on the event loop that drives every part."""
    data = reader.read(size)
    digest.update(data)
    if not checksummed:
        return data, {}
    crc = zlib.crc32(data).to_bytes(4, "big")
    return data, {"ChecksumCRC32": base64.b64encode(crc).decode()}


def _write_hashed(writer: IO[bytes], data: bytes, digest: Any) -> None:
    digest.update(data)
    writer.write(data)
