// Reading a training run's files in tests: metrics.csv's train_loss column, weights.pt and
// checkpoint.pt (torch.save's zip + pickle format) as dicts.
#pragma once

#include <torch/serialize.h>
#include <torch/torch.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace posenc::train {

// train_loss column of metrics.csv.
inline std::vector<double> train_losses(const std::string& folder) {
  std::ifstream in(folder + "/metrics.csv");
  std::string line;
  std::getline(in, line);
  std::vector<double> losses;
  while (std::getline(in, line)) {
    std::stringstream cells(line);
    std::string cell;
    for (int i = 0; i < 4 && std::getline(cells, cell, ','); ++i) {
    }
    losses.push_back(std::stod(cell));  // step, epoch, lr, train_loss
  }
  return losses;
}

// A file written by torch.save / posenc's run files, as the dict it holds.
inline c10::impl::GenericDict read_pickled_dict(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return torch::pickle_load(bytes).toGenericDict();
}

inline std::map<std::string, at::Tensor> read_weights(const std::string& path) {
  std::map<std::string, at::Tensor> weights;
  for (const auto& item : read_pickled_dict(path))
    weights[item.key().toStringRef()] = item.value().toTensor();
  return weights;
}

}  // namespace posenc::train
