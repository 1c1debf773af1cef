// The HAP C++ API in one include: tensors, random numbers, the differentiable functions, autograd,
// and the model API (modules, layers, GPT, optimizers, schedules, clipping, serialization).
//   #include <hap/hap.h>   and link hap::hap (find_package(hap)).
#pragma once

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "models/clip.h"
#include "models/gpt.h"
#include "models/init.h"
#include "models/layers.h"
#include "models/lr_schedule.h"
#include "models/module.h"
#include "models/optim.h"
#include "models/serialize.h"
#include "ops/functional.h"
#include "ops/threads.h"
