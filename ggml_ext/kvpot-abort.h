// Inside the library: whether a signal is waiting in the descriptor kvpot_abort_watch was given
// (kvpot-abort.cpp). The decode's abort callback and the model loader's progress callback both ask it.
#pragma once

bool kvpot_signal_waiting();
