// posenc — one include for the core: Positions, the encoder interface, every 1D encoder and the
// attention layer that uses them.
#pragma once

#include "posenc/core/encoder.h"
#include "posenc/core/positions.h"
#include "posenc/core/stream.h"
#include "posenc/encoders/alibi.h"
#include "posenc/encoders/axial_sincos.h"
#include "posenc/encoders/learned.h"
#include "posenc/encoders/learned_grid.h"
#include "posenc/encoders/learned_spacetime.h"
#include "posenc/encoders/relative_2d.h"
#include "posenc/encoders/rope.h"
#include "posenc/encoders/rope_mixed.h"
#include "posenc/encoders/shaw.h"
#include "posenc/encoders/sinusoidal.h"
#include "posenc/encoders/t5.h"
#include "posenc/encoders/time.h"
#include "posenc/functional/relative.h"
#include "posenc/functional/rope.h"
#include "posenc/functional/sinusoidal.h"
#include "posenc/functional/time.h"
#include "posenc/nn/attention.h"
