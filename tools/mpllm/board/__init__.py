"""Everything that talks to a board, real or the host board: writing stories
(chat, hostboard), flashing (flash, firmware_pins), measuring (bench, gate,
quality). The top of the import graph: nothing below imports it."""
