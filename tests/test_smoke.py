from shardpipes.datapipes.iter import IterableWrapper


def test_pipeline_yields_every_sample_once(shard_pattern):
    dp = (
        IterableWrapper([shard_pattern])
        .shard_expand()
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .decode()
    )
    ids = [s[".json"]["id"] for s in dp]
    assert sorted(ids) == list(range(11 + 13 + 17 + 19 + 23 + 29 + 31))
