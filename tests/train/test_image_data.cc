// The dataset "images": CIFAR-10 binary files written here, the synthetic set, epochs,
// augmentation, and the errors for bad files (in the library and through hap-train's exit codes).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>

#include "train/dataset.h"
#include "train/image_data.h"

namespace hap::train {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& tag) {
  fs::path p = fs::temp_directory_path() / ("hap_images_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// Records whose label is labels[i] and whose every pixel byte is first_pixel + i.
void write_cifar(const fs::path& p, const std::vector<int>& labels, int first_pixel = 0) {
  std::ofstream out(p, std::ios::binary);
  for (size_t i = 0; i < labels.size(); ++i) {
    out.put(static_cast<char>(labels[i]));
    std::string pixels(static_cast<size_t>(kCifarImageBytes),
                       static_cast<char>(first_pixel + static_cast<int>(i)));
    out << pixels;
  }
}

std::vector<nn::InputSpec> inputs(std::int64_t batch, std::int64_t classes = 10,
                                  std::int64_t size = 32, std::int64_t channels = 3) {
  return {{"images", {batch, channels, size, size}, DType::F32, 0},
          {"labels", {batch}, DType::I64, 0, classes}};
}

std::shared_ptr<Dataset> open(const std::string& path, const std::vector<nn::InputSpec>& in,
                              std::map<std::string, nn::OptionValue> set = {},
                              std::uint64_t seed = 5) {
  const DatasetEntry& e = find_dataset("images");
  nn::Options o(e.options);
  o.set("path", path);
  for (auto& [k, v] : set) o.set(k, v);
  return open_dataset(e, o, in, seed);
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// The raw pixel byte of record-identifying images (every pixel the same): undo the channel-0
// normalisation of the first pixel.
int pixel_byte(const Tensor& images, std::int64_t row) {
  const float v = images.data<float>()[row * kCifarImageBytes];
  return static_cast<int>(std::lround((v * 0.2470f + 0.4914f) * 255.0f));
}

TEST(ImageData, AFileWhoseSizeIsNotWholeRecordsNamesTheFileAndItsSize) {
  fs::path d = scratch("size");
  write_cifar(d / "a.bin", {1, 2});
  std::ofstream(d / "a.bin", std::ios::app) << "xyz";
  std::string m = message_of([&] { read_cifar({(d / "a.bin").string()}, 10); });
  EXPECT_NE(m.find((d / "a.bin").string()), std::string::npos) << m;
  EXPECT_NE(m.find("6149 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("3073"), std::string::npos) << m;
  std::ofstream(d / "empty.bin", std::ios::binary);
  m = message_of([&] { read_cifar({(d / "empty.bin").string()}, 10); });
  EXPECT_NE(m.find("0 bytes"), std::string::npos) << m;
  fs::remove_all(d);
}

TEST(ImageData, ALabelOutOfRangeNamesTheFileTheRecordAndTheLabel) {
  fs::path d = scratch("label");
  write_cifar(d / "b.bin", {0, 9, 10, 3});
  std::string m = message_of([&] { read_cifar({(d / "b.bin").string()}, 10); });
  EXPECT_NE(m.find((d / "b.bin").string()), std::string::npos) << m;
  EXPECT_NE(m.find("record 2"), std::string::npos) << m;
  EXPECT_NE(m.find("label 10"), std::string::npos) << m;
  EXPECT_NE(m.find("[0, 10)"), std::string::npos) << m;
  // A model with fewer classes rejects labels the file's format allows.
  write_cifar(d / "c.bin", {0, 4});
  m = message_of([&] { read_cifar({(d / "c.bin").string()}, 4); });
  EXPECT_NE(m.find("label 4"), std::string::npos) << m;
  fs::remove_all(d);
}

TEST(ImageData, ADirectoryReadsTrainingFilesInNameOrderAndTheTestBatchForValidation) {
  fs::path d = scratch("dir");
  write_cifar(d / "data_batch_2.bin", {7, 8}, 20);
  write_cifar(d / "data_batch_1.bin", {1, 2, 3}, 10);
  write_cifar(d / "test_batch.bin", {4, 5, 6, 0}, 30);
  std::ofstream(d / "readme.html") << "not a batch";
  auto ds = open(d.string(), inputs(4), {{"val_fraction", 0.5}});
  EXPECT_NE(ds->describe().find("5 training and 4 validation images"), std::string::npos)
      << ds->describe();
  // Validation batches read the test batch in order.
  nn::Batch v = ds->read(Split::kVal, 0, 0, 4);
  EXPECT_EQ(v.at("labels").to_vector(), (std::vector<double>{4, 5, 6, 0}));
  for (int r = 0; r < 4; ++r) EXPECT_EQ(pixel_byte(v.at("images"), r), 30 + r);
  // Normalisation: (byte / 255 - mean_c) / std_c per channel.
  const float* px = v.at("images").data<float>();
  EXPECT_NEAR(px[0], (30 / 255.0 - 0.4914) / 0.2470, 1e-5);
  EXPECT_NEAR(px[1024], (30 / 255.0 - 0.4822) / 0.2435, 1e-5);
  EXPECT_NEAR(px[2048], (30 / 255.0 - 0.4465) / 0.2616, 1e-5);
  // A directory without training files is an error naming it.
  fs::path e = scratch("nodata");
  write_cifar(e / "test_batch.bin", {1});
  std::string m = message_of([&] { open(e.string(), inputs(4)); });
  EXPECT_NE(m.find("no data_batch_*.bin"), std::string::npos) << m;
  EXPECT_NE(m.find(e.string()), std::string::npos) << m;
  fs::remove_all(d);
  fs::remove_all(e);
}

TEST(ImageData, OneFileHoldsOutTheLastRecordsForValidation) {
  fs::path d = scratch("held");
  write_cifar(d / "all.bin", {0, 1, 2, 3, 4, 5, 6, 7});
  auto ds = open((d / "all.bin").string(), inputs(2), {{"val_fraction", 0.25}});
  EXPECT_NE(ds->describe().find("6 training and 2 validation"), std::string::npos)
      << ds->describe();
  EXPECT_EQ(ds->read(Split::kVal, 0, 0, 2).at("labels").to_vector(), (std::vector<double>{6, 7}));
  // Batches past the end of the split wrap around.
  EXPECT_EQ(ds->read(Split::kVal, 1, 0, 2).at("labels").to_vector(), (std::vector<double>{6, 7}));
  std::string m = message_of([&] {
    open((d / "all.bin").string(), inputs(2), {{"val_fraction", 0.05}});
  });
  EXPECT_NE(m.find("too few"), std::string::npos) << m;
  fs::remove_all(d);
}

TEST(ImageData, EachTrainingEpochVisitsEveryRecordOnceInAFreshOrder) {
  fs::path d = scratch("epoch");
  std::vector<int> labels(12);
  for (int i = 0; i < 12; ++i) labels[i] = i % 10;
  write_cifar(d / "data_batch_1.bin", labels, 100);
  write_cifar(d / "test_batch.bin", {0});
  auto ds = open(d.string(), inputs(4));
  std::vector<std::vector<int>> epochs(2);
  for (std::uint64_t step = 0; step < 6; ++step) {
    nn::Batch b = ds->read(Split::kTrain, step, 0, 4);
    const std::vector<double> l = b.at("labels").to_vector();
    for (int r = 0; r < 4; ++r) {
      const int record = pixel_byte(b.at("images"), r) - 100;
      EXPECT_EQ(l[static_cast<size_t>(r)], record % 10) << "a label stays with its image";
      epochs[step / 3].push_back(record);
    }
  }
  for (const auto& e : epochs) EXPECT_EQ(std::set<int>(e.begin(), e.end()).size(), 12u);
  EXPECT_NE(epochs[0], epochs[1]);
  std::vector<int> in_order(12);
  std::iota(in_order.begin(), in_order.end(), 0);
  EXPECT_NE(epochs[0], in_order);
  fs::remove_all(d);
}

TEST(ImageData, RowsReadAloneEqualTheRowsOfTheWholeBatch) {
  for (const bool augment : {false, true}) {
    auto ds = open("", inputs(7, 5, 8), {{"synthetic_size", int64_t{50}}, {"augment", augment}});
    for (std::uint64_t step : {0u, 9u}) {
      nn::Batch whole = ds->read(Split::kTrain, step, 0, 7);
      nn::Batch part = ds->read(Split::kTrain, step, 3, 6);
      const std::vector<double> wi = whole.at("images").to_vector(),
                                pi = part.at("images").to_vector();
      const std::int64_t per = 3 * 8 * 8;
      EXPECT_EQ(std::vector<double>(wi.begin() + 3 * per, wi.begin() + 6 * per), pi);
      const std::vector<double> wl = whole.at("labels").to_vector();
      EXPECT_EQ(std::vector<double>(wl.begin() + 3, wl.begin() + 6), part.at("labels").to_vector());
    }
  }
}

TEST(ImageData, SyntheticImagesAreDeterministicLearnableAndFollowTheModelsGeometry) {
  auto in = inputs(16, 4, 12, 2);
  auto a = open("", in, {{"synthetic_noise", 0.0}}, 3);
  auto b = open("", in, {{"synthetic_noise", 0.0}}, 3);
  auto c = open("", in, {{"synthetic_noise", 0.0}}, 4);
  nn::Batch x = a->read(Split::kTrain, 2, 0, 16), y = b->read(Split::kTrain, 2, 0, 16),
            z = c->read(Split::kTrain, 2, 0, 16);
  EXPECT_EQ(x.at("images").shape(), (Shape{16, 2, 12, 12}));
  EXPECT_EQ(x.at("images").to_vector(), y.at("images").to_vector());
  EXPECT_EQ(x.at("labels").to_vector(), y.at("labels").to_vector());
  EXPECT_NE(x.at("images").to_vector(), z.at("images").to_vector());
  EXPECT_NE(a->describe().find("synthetic"), std::string::npos) << a->describe();
  // Without noise an image is its class's pattern: equal labels give equal images, different
  // labels different ones; every class occurs.
  const std::vector<double> l = x.at("labels").to_vector(), im = x.at("images").to_vector();
  const size_t per = 2 * 12 * 12;
  std::set<double> classes(l.begin(), l.end());
  EXPECT_GE(classes.size(), 3u);
  for (double k : classes) EXPECT_TRUE(k >= 0 && k < 4) << k;
  for (size_t i = 0; i < 16; ++i)
    for (size_t j = 0; j < i; ++j) {
      const bool same =
          std::equal(im.begin() + i * per, im.begin() + (i + 1) * per, im.begin() + j * per);
      EXPECT_EQ(same, l[i] == l[j]) << i << " " << j;
    }
}

TEST(ImageData, AugmentationCropsAndFlipsTheTrainingSplitOnly) {
  auto in = inputs(8, 3, 16);
  auto plain = open("", in, {{"synthetic_noise", 0.0}});
  auto aug = open("", in, {{"synthetic_noise", 0.0}, {"augment", true}});
  const std::vector<double> p = plain->read(Split::kTrain, 0, 0, 8).at("images").to_vector();
  const std::vector<double> q = aug->read(Split::kTrain, 0, 0, 8).at("images").to_vector();
  EXPECT_NE(p, q);
  // Every augmented pixel is padding (0) or a pixel of the same channel of the same image.
  const size_t plane = 16 * 16;
  for (size_t img = 0; img < 8; ++img)
    for (size_t c = 0; c < 3; ++c) {
      std::set<double> values(p.begin() + (img * 3 + c) * plane,
                              p.begin() + (img * 3 + c + 1) * plane);
      values.insert(0.0);
      for (size_t k = 0; k < plane; ++k)
        EXPECT_TRUE(values.count(q[(img * 3 + c) * plane + k])) << img << " " << c << " " << k;
    }
  EXPECT_EQ(plain->read(Split::kVal, 0, 0, 8).at("images").to_vector(),
            aug->read(Split::kVal, 0, 0, 8).at("images").to_vector());
}

TEST(ImageData, InputsTheDataCannotGiveAreNamed) {
  fs::path d = scratch("geometry");
  write_cifar(d / "x.bin", {1, 2, 3, 4});
  std::string m = message_of([&] { open((d / "x.bin").string(), inputs(2, 10, 64)); });
  EXPECT_NE(m.find("image size to 32"), std::string::npos) << m;
  std::vector<nn::InputSpec> tokens = {{"idx", {2, 8}, DType::I64, 0, 256}};
  m = message_of([&] { open("", tokens); });
  EXPECT_NE(m.find("idx: i64[2, 8]"), std::string::npos) << m;
  fs::remove_all(d);
}

// hap-train: data errors exit 1, config errors 2, both naming what was wrong.
int run_train(const std::string& args, std::string* err) {
  const std::string errfile =
      (fs::temp_directory_path() / ("hap_images_err_" + std::to_string(::getpid()))).string();
  const std::string config = std::string(HAP_SOURCE_DIR) + "/configs/vgg19.yaml";
  const std::string cmd = std::string(HAP_TRAIN_BIN) + " --config " + config +
                          " --set train.steps=1 --set train.warmup_steps=0 --set "
                          "train.log_file= " +
                          args + " > /dev/null 2> " + errfile;
  const int rc = std::system(cmd.c_str());
  std::ifstream in(errfile);
  err->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  fs::remove(errfile);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(ImageData, HapTrainExitsWithOneForBadCifarFilesAndTwoForBadImageSizes) {
  fs::path d = scratch("binary");
  write_cifar(d / "bad.bin", {1, 2});
  std::ofstream(d / "bad.bin", std::ios::app) << "x";
  std::string err;
  EXPECT_EQ(run_train("--set data.path=" + (d / "bad.bin").string(), &err), 1);
  EXPECT_NE(err.find((d / "bad.bin").string()), std::string::npos) << err;
  EXPECT_NE(err.find("3073"), std::string::npos) << err;
  write_cifar(d / "label.bin", {1, 11});
  EXPECT_EQ(run_train("--set data.path=" + (d / "label.bin").string(), &err), 1);
  EXPECT_NE(err.find("label 11"), std::string::npos) << err;
  EXPECT_EQ(run_train("--set model.image_size=40", &err), 2);
  EXPECT_NE(err.find("model.image_size"), std::string::npos) << err;
  EXPECT_NE(err.find("40"), std::string::npos) << err;
  fs::remove_all(d);
}

}  // namespace
}  // namespace hap::train
