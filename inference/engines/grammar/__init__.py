"""Grammars: the value a request holds (`grammar`, plain: the web side imports it), their compilers (`compilers`),
the web's checker processes (`checks`) and the own engine's token masks (`constraint`). Import the module you need:
this package loads none of them."""
