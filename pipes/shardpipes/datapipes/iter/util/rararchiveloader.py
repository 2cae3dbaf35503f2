"""torchdata 0.9's ``datapipes.iter.util.rararchiveloader`` module path, for code that imports or patches it."""

from shardpipes.datapipes.iter import RarArchiveLoader as RarArchiveLoaderIterDataPipe


class RarfilePatcher:
    """0.9's patch of ``rarfile``'s direct reader; shardpipes reads RAR members without it."""

    def __init__(self) -> None:
        self._active = False

    def start(self) -> None:
        """Nothing to patch: shardpipes' ``load_from_rar`` opens each member on its own."""
        self._active = True

    def stop(self) -> None:
        """Undo :meth:`start`."""
        self._active = False


__all__ = ["RarArchiveLoaderIterDataPipe", "RarfilePatcher"]
