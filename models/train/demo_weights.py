"""Train the ``digits_cnn`` checkpoints the demo repository bundles, and write them to
``models/train/weights/`` (committed: 40-160 kB each).

``python -m models.train.demo_weights`` rebuilds them: fp32 training (no qwZ, float gradient
averaging) and ZeRO++-style training at 8 and 4 bits (qwZ + qgZ int4 on 2 nodes x 4 workers),
seed 0, 20 epochs of the digits training split. The int8 and int4 files are the trainer's own
codes and scales; the demo serves them as they are.
"""

from __future__ import annotations

from pathlib import Path

from models.train.data import DIGITS_CNN

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
EPOCHS = 20.0
SEED = 0
# (model name, bits) -> committed checkpoint file; bits None is the fp32 model.
TRAINED_FILES: dict[tuple[str, int | None], str] = {
    (DIGITS_CNN.name, None): "digits_cnn_fp32.safetensors",
    (DIGITS_CNN.name, 8): "digits_cnn_int8.safetensors",
    (DIGITS_CNN.name, 4): "digits_cnn_int4.safetensors",
}


def build(directory: Path = WEIGHTS_DIR) -> list[Path]:
    from models.train.export import export_checkpoint
    from models.train.trainer import TrainConfig, Trainer

    written = []
    for (_, bits), file in TRAINED_FILES.items():
        config = TrainConfig(bits=bits, qgz=bits is not None, epochs=EPOCHS, seed=SEED)
        trainer = Trainer(config)
        trainer.run(progress=False)
        served = trainer.served_weights()
        print(f"{file}: test accuracy {trainer.accuracy(served, 'test'):.4f}")
        written.append(export_checkpoint(trainer, directory / file))
    return written


if __name__ == "__main__":
    build()
