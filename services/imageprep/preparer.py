"""ImagePreparer: one image from caller input to retained PreparedImage (runs in worker threads).

    ImageInput --sources--> EncodedImage --source_key--> retention lookup
        hit:  the retained PreparedImage (no decode; the header still meets this request's
              pixel limit, as it may have been prepared for a core with looser limits)
        miss: decode_image -> process_image -> retain -> PreparedImage

Concurrent requests for the same encoded source (the same image twice in one request, or two
clients at once) share one preparation: the first registers an in-flight future under the
source key and the others wait for it, so each distinct source is decoded once.
"""

from __future__ import annotations

import concurrent.futures
import threading
from dataclasses import dataclass

from services.common.errors import ValidationError
from services.imageprep.cache.retention import RetentionCache
from services.imageprep.decode import DecodeLimits, check_decoded_pixels, decode_image
from services.imageprep.identity import source_key
from services.imageprep.prepared import PreparedImage
from services.imageprep.processor import process_image
from services.imageprep.profiles import ProcessorSettings
from services.imageprep.requests import ImageInput
from services.imageprep.sources import EncodedImage, from_bytes, parse_data_url


@dataclass(frozen=True, slots=True)
class Prepared:
    image: PreparedImage
    cache_hit: bool            # True when no decode was needed


class ImagePreparer:
    def __init__(self, limits: DecodeLimits, cache: RetentionCache) -> None:
        self.limits = limits
        self.cache = cache
        self._lock = threading.Lock()
        self._inflight: dict[bytes, concurrent.futures.Future[PreparedImage]] = {}

    def encoded(self, image: ImageInput, limits: DecodeLimits | None = None) -> EncodedImage:
        limits = limits or self.limits
        if image.data_url and image.data:
            raise ValidationError("an image has either a data URL or raw data, not both")
        if image.data_url:
            return parse_data_url(image.data_url, max_encoded_bytes=limits.max_encoded_bytes,
                                  source=limits.bytes_source)
        if image.data:
            return from_bytes(image.data, image.media_type,
                              max_encoded_bytes=limits.max_encoded_bytes,
                              source=limits.bytes_source)
        raise ValidationError("an image needs a data URL or raw data")

    def prepare(self, image: ImageInput, settings: ProcessorSettings,
                limits: DecodeLimits | None = None) -> Prepared:
        """One image under `limits` (default: imageprep's own; a request's may be tighter)."""
        limits = limits or self.limits
        encoded = self.encoded(image, limits)
        key = source_key(encoded.media_type, encoded.data, settings)
        retained = self._retained(key)
        if retained is not None:
            return self._held(retained, encoded, limits)
        with self._lock:
            running = self._inflight.get(key)
            if running is None:
                mine: concurrent.futures.Future[PreparedImage] = concurrent.futures.Future()
                self._inflight[key] = mine
        if running is not None:
            return self._held(running.result(), encoded, limits)
        try:
            # Another worker may have finished this source between the lookup and now.
            retained = self._retained(key)
            if retained is not None:
                mine.set_result(retained)
                return self._held(retained, encoded, limits)
            prepared = process_image(decode_image(encoded, limits), settings)
            self.cache.put(key, prepared)
            mine.set_result(prepared)
            return Prepared(prepared, cache_hit=False)
        except BaseException as exc:
            mine.set_exception(exc)
            raise
        finally:
            with self._lock:
                del self._inflight[key]

    @staticmethod
    def _held(image: PreparedImage, encoded: EncodedImage, limits: DecodeLimits) -> Prepared:
        """An image prepared before, by this request's source key: the source key leaves out
        the limits, so it may have been prepared under looser ones (another core's sharing
        this imageprep, or imageprep's own); this request's pixel limit still applies."""
        check_decoded_pixels(encoded, limits)
        return Prepared(image, cache_hit=True)

    def _retained(self, key: bytes) -> PreparedImage | None:
        identity = self.cache.lookup_source(key)
        return self.cache.get(identity) if identity is not None else None
