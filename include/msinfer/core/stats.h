// Summary statistics of measured samples.
#pragma once

#include <vector>

namespace msinfer {

// Nearest-rank percentile: the smallest sample with at least q of the samples
// at or below it (q in [0, 1]); 0 for no samples. Takes a copy to sort.
double percentile(std::vector<double> samples, double q);
double mean(const std::vector<double>& samples);

}  // namespace msinfer
