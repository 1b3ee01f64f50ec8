"""The end-to-end benchmark behind `byoc bench` (the command and its options: `byoc.cli.bench`):
`models` loads what a `--models` entry names, `systems` builds every system on it, checks each
against onnxruntime and times them against each other (`byoc.timing`), `table` prints the
comparison."""
