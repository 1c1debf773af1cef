// The HAP C++ API in one include: tensors, random numbers, the differentiable functions,
// autograd, the model API (modules, layers, the Model interface, the model zoo, optimizers,
// schedules, clipping, serialization), and the training runtime (Trainer on one process or on
// MPI ranks, datasets, run and cluster configs, plans).
//   #include <hap/hap.h>   and link hap::train (find_package(hap)): it brings hap::hap,
//   hap::parallel and MPI.
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
#include "models/model.h"
#include "models/module.h"
#include "models/optim.h"
#include "models/options.h"
#include "models/serialize.h"
#include "models/zoo.h"
#include "ops/functional.h"
#include "ops/threads.h"
#include "parallel/communicator.h"
#include "synth/cluster.h"
#include "synth/synthesizer.h"
#include "train/cluster_config.h"
#include "train/config.h"
#include "train/dataset.h"
#include "train/from_config.h"
#include "train/plan_io.h"
#include "train/plan_report.h"
#include "train/trace.h"
#include "train/trainer.h"
