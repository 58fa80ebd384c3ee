#!/usr/bin/env python3
"""Fixtures for posenc's audio features, from librosa (the reference the tests check against).

    /work/venv-tools/bin/python tools/gen_fixtures_audio.py   # writes tests/fixtures/log_mel.json

Needs numpy and librosa (pip install librosa==0.11.0). Each case stores its input signal (a
deterministic test signal: a chirp, two harmonics and seeded noise), the options, librosa's mel
filterbank (librosa.filters.mel) and its log-mel spectrogram:
    S   = librosa.feature.melspectrogram(y, sr, n_fft, hop_length, win_length, window="hann",
                                         center, pad_mode, power, n_mels, fmin, fmax, htk, norm)
    out = ln(max(S, floor))            [frames, n_mels] (librosa's [n_mels, frames] transposed)
computed in float64 (the input cast from float32, as posenc reads it).
"""

import json
import os

import librosa
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "log_mel.json")


def signal(sr, seconds, seed):
    t = np.arange(int(round(sr * seconds))) / sr
    f0, f1 = 100.0, 0.45 * sr
    chirp = np.sin(2 * np.pi * (f0 * t + (f1 - f0) / (2 * seconds) * t * t))
    tones = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 1320 * t + 0.5)
    noise = 0.05 * np.random.default_rng(seed).standard_normal(t.shape)
    envelope = np.minimum(1.0, 10 * t) * (0.6 + 0.4 * np.cos(2 * np.pi * 3 * t))
    return (0.5 * envelope * (chirp + tones) + noise).astype(np.float32)


def case(
    name,
    sr,
    seconds,
    seed,
    n_fft,
    hop,
    n_mels,
    win=None,
    fmin=0.0,
    fmax=None,
    htk=False,
    norm="slaney",
    center=True,
    pad_mode="constant",
    power=2.0,
    floor=1e-10,
    bank=False,
):
    y32 = signal(sr, seconds, seed)
    y = y32.astype(np.float64)
    mel = librosa.feature.melspectrogram(
        y=y,
        sr=sr,
        n_fft=n_fft,
        hop_length=hop,
        win_length=win,
        window="hann",
        center=center,
        pad_mode=pad_mode,
        power=power,
        n_mels=n_mels,
        fmin=fmin,
        fmax=fmax,
        htk=htk,
        norm=norm,
        dtype=np.float64,
    )
    out = np.log(np.maximum(mel, floor)).T
    c = {
        "name": name,
        "options": {
            "sample_rate": sr,
            "n_fft": n_fft,
            "win_length": win or n_fft,
            "hop_length": hop,
            "n_mels": n_mels,
            "f_min": fmin,
            "f_max": fmax if fmax is not None else sr / 2.0,
            "mel_scale": "htk" if htk else "slaney",
            "norm": "slaney" if norm == "slaney" else "none",
            "center": center,
            "pad_mode": pad_mode,
            "power": power,
            "log_floor": floor,
        },
        "samples": [float(v) for v in y32],
        "log_mel_shape": list(out.shape),
        "log_mel": [float(v) for v in out.flatten()],
    }
    if bank:
        fb = librosa.filters.mel(
            sr=sr,
            n_fft=n_fft,
            n_mels=n_mels,
            fmin=fmin,
            fmax=fmax,
            htk=htk,
            norm=norm,
            dtype=np.float64,
        ).T  # [1 + n_fft / 2, n_mels]
        c["filterbank_shape"] = list(fb.shape)
        c["filterbank"] = [float(v) for v in fb.flatten()]
    return c


def main():
    cases = [
        # Whisper's front end (16 kHz, 25 ms window, 10 ms hop, 80 Slaney mels)
        case("whisper_16k_slaney", 16000, 0.25, 1, 400, 160, 80, bank=True),
        # HTK scale, no area normalization (torchaudio's and HTK's default)
        case("htk_no_norm_16k", 16000, 0.25, 2, 400, 160, 64, htk=True, norm=None, bank=True),
        # telephone audio as the asterisk prompts are: 8 kHz, 32 ms window, band-limited bank
        case("asterisk_8k_band", 8000, 0.3, 3, 256, 80, 40, fmin=20.0, fmax=3800.0),
        # a window shorter than the FFT (zero-padded, centred), reflect padding, magnitude
        case(
            "short_window_reflect_power1",
            16000,
            0.2,
            4,
            512,
            128,
            48,
            win=320,
            pad_mode="reflect",
            power=1.0,
        ),
        # no centring: frames start at sample 0
        case("uncentred_htk_slaney_norm", 22050, 0.2, 5, 1024, 256, 128, htk=True, center=False),
    ]
    doc = {
        "generator": f"tools/gen_fixtures_audio.py (librosa {librosa.__version__}, numpy {np.__version__})",
        "source": "librosa.feature.melspectrogram and librosa.filters.mel; log: natural log of "
        "max(S, log_floor); log_mel is [frames, n_mels] row-major; filterbank is "
        "[1 + n_fft/2, n_mels] row-major",
        "cases": cases,
    }
    with open(OUT + ".tmp", "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    os.replace(OUT + ".tmp", OUT)
    print(f"wrote {OUT}: {len(cases)} cases ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main()
